"""`<trainer.output_dir>/plan.json`: the plan the launching process resolved, which every rank loads.

The launcher plans once (`python -m hybridflow.run`, or its `--plan-only` step before `srun`/`torchrun` in a
Slurm script) and writes the plan here with a digest of the resolved config; a rank reads it back instead of
planning again, and refuses a file written for another config (or none at all) with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from omegaconf import OmegaConf

from hybridflow.config import ExperimentConfig
from hybridflow.errors import UserError
from hybridflow.placement import Plan

PLAN_FILE = "plan.json"
FORMAT = 1


def plan_path(cfg: ExperimentConfig) -> Path:
    return Path(cfg.trainer.output_dir) / PLAN_FILE


def config_digest(cfg: ExperimentConfig) -> str:
    """sha256 of the resolved config as YAML (the text `--cfg job` prints): the plan is a function of it."""
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.structured(cfg)).encode()).hexdigest()


def write_plan(cfg: ExperimentConfig, plan: Plan) -> Path:
    """Write the plan for this config atomically (a rank never reads half a file); returns its path."""
    path = plan_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT, "experiment": cfg.name, "config_sha256": config_digest(cfg), **plan.to_json()}
    tmp = path.with_name(f".{PLAN_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return path


def read_plan(cfg: ExperimentConfig) -> Plan:
    """The plan the launcher wrote for this config; UserError when it is missing or was written for another."""
    path = plan_path(cfg)
    fix = ("ranks started by srun or torchrun load the plan their launcher wrote: run `python -m hybridflow.run "
           "--plan-only <the same overrides>` before starting them (the script `python -m hybridflow.sbatch` "
           "renders does), with trainer.output_dir on a filesystem every node sees")
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"trainer.output_dir: no {PLAN_FILE} in {path.parent}; {fix}") from None
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"trainer.output_dir: {path} is not a readable plan ({err}); {fix}") from None
    if record.get("format") != FORMAT or record.get("config_sha256") != config_digest(cfg):
        raise UserError(f"trainer.output_dir: {path} was planned for another config than this rank's "
                        f"(experiment {record.get('experiment')!r}, or different overrides); {fix}")
    return Plan.from_json(record)
