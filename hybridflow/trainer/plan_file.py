"""`<trainer.output_dir>/plan.json`: the config and plan the launching process resolved; ranks only read it.

The launcher resolves once (`python -m hybridflow.run`, or its `--plan-only` step before `srun`/`torchrun` in a
Slurm script: hybridflow.resolve, then the planner) and writes here the plan, the resolved config (checkpoints
converted, layers cut, the planner's engine and its defaults, every derived value) and a digest of the config
it was composed as. A rank reads the file back (`read_run`) instead of composing, converting or planning again;
a process that composed a config itself (`read_plan`) refuses a file written for another (or none) in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from omegaconf import OmegaConf

from hybridflow.config import ExperimentConfig
from hybridflow.config.experiment import with_engine
from hybridflow.errors import UserError
from hybridflow.placement import Plan

PLAN_FILE = "plan.json"
FORMAT = 2  # 2: carries the resolved config


def plan_path(cfg: ExperimentConfig) -> Path:
    return Path(cfg.trainer.output_dir) / PLAN_FILE


def config_digest(cfg: ExperimentConfig) -> str:
    """sha256 of the resolved config as YAML (the text `--cfg job` prints): the plan is a function of it."""
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.structured(cfg)).encode()).hexdigest()


def write_plan(cfg: ExperimentConfig, plan: Plan) -> Path:
    """Write the plan and the config it runs (with the plan's rollout engine and that engine's defaults)
    atomically (a rank never reads half a file); returns its path."""
    path = plan_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.to_container(OmegaConf.structured(with_engine(cfg, plan.rollout_engine)))
    record = {"format": FORMAT, "experiment": cfg.name, "config_sha256": config_digest(cfg), "config": resolved,
              **plan.to_json()}
    tmp = path.with_name(f".{PLAN_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return path


_FIX = ("ranks started by srun or torchrun load the plan their launcher wrote: run `python -m hybridflow.run "
        "--plan-only <the same overrides>` before starting them (the script `python -m hybridflow.sbatch` "
        "renders does), with trainer.output_dir on a filesystem every node sees")


def _read(path: Path) -> dict:
    fix = _FIX
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"trainer.output_dir: no {PLAN_FILE} in {path.parent}; {fix}") from None
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"trainer.output_dir: {path} is not a readable plan ({err}); {fix}") from None
    if record.get("format") != FORMAT:
        raise UserError(f"trainer.output_dir: {path} is a plan of format {record.get('format')}, not {FORMAT} "
                        f"(written by another hybridflow); {fix}")
    return record


def read_plan(cfg: ExperimentConfig) -> Plan:
    """The plan the launcher wrote for this config; UserError when it is missing or was written for another."""
    path, fix = plan_path(cfg), _FIX
    record = _read(path)
    if record.get("config_sha256") != config_digest(cfg):
        raise UserError(f"trainer.output_dir: {path} was planned for another config than this rank's "
                        f"(experiment {record.get('experiment')!r}, or different overrides); {fix}")
    return Plan.from_json(record)


def read_run(path: Path) -> tuple[ExperimentConfig, Plan]:
    """The resolved config and the plan in plan.json at `path`: what a rank runs. Reading only: no Hydra
    compose, no checkpoint conversion, no planning (OmegaConf checks the types against the schema)."""
    record = _read(path)
    typed = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), record["config"])
    cfg = OmegaConf.to_object(typed)
    assert isinstance(cfg, ExperimentConfig)
    return cfg, Plan.from_json(record)
