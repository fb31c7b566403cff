"""`<trainer.output_dir>/plan.json`: the config and plan the launching process resolved; ranks only read it.

The launcher resolves once (`python -m hybridflow.run`, or its `--plan-only` step before `srun`/`torchrun` in a
Slurm script: hybridflow.resolve, then the planner) and writes here the plan, the resolved config (checkpoints
converted, layers cut, the planner's engine and its defaults, every derived value) and a digest of the config
it was composed as. A rank reads the file back (`read_run`, given as `python -m hybridflow.run --plan FILE`)
instead of composing, converting or planning again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from omegaconf import OmegaConf

from hybridflow.config import ExperimentConfig
from hybridflow.config.experiment import with_engine
from hybridflow.config.load import import_modules
from hybridflow.errors import UserError
from hybridflow.placement import Plan

PLAN_FILE = "plan.json"
FORMAT = 2  # 2: carries the resolved config


def plan_path(cfg: ExperimentConfig) -> Path:
    return Path(cfg.trainer.output_dir) / PLAN_FILE


def config_digest(cfg: ExperimentConfig) -> str:
    """sha256 of the resolved config as YAML (the text `--cfg job` prints): the plan is a function of it."""
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.structured(cfg)).encode()).hexdigest()


def write_plan(cfg: ExperimentConfig, plan: Plan, path: Path | None = None) -> Path:
    """Write the plan and the config it runs (with the plan's rollout engine and that engine's defaults)
    atomically (a rank never reads half a file) at `path` (default: `plan_path(cfg)`); returns the path."""
    path = plan_path(cfg) if path is None else path
    # A path `--plan` gave, or the default one under trainer.output_dir: the error names what to change.
    field, fix = (("trainer.output_dir", "set trainer.output_dir to a writable directory") if path == plan_path(cfg)
                  else ("--plan", "give a path in a writable directory"))
    if path.is_dir():
        raise UserError(f"{field}: {path} is a directory; give a file path such as {path / PLAN_FILE}")
    resolved = OmegaConf.to_container(OmegaConf.structured(with_engine(cfg, plan.rollout_engine)))
    record = {"format": FORMAT, "experiment": cfg.name, "config_sha256": config_digest(cfg), "config": resolved,
              **plan.to_json()}
    tmp = path.with_name(f".{PLAN_FILE}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UserError(f"{field}: cannot write {path} ({err.strerror or err}); {fix}") from None
    return path


def read_run(path: Path, fix: str = "write it with `python -m hybridflow.run --plan-only`") -> tuple[
        ExperimentConfig, Plan]:
    """The resolved config and the plan in plan.json at `path`: what a rank runs. Reading only: no Hydra
    compose, no checkpoint conversion, no planning (OmegaConf checks the types against the schema). A missing
    or unreadable file is a UserError ending in `fix`."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"--plan: no plan file {path}; {fix}") from None
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"--plan: {path} is not a readable plan ({err}); {fix}") from None
    if record.get("format") != FORMAT:
        raise UserError(f"--plan: {path} is a plan of format {record.get('format')}, not {FORMAT} "
                        f"(written by another hybridflow); {fix}")
    typed = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), record["config"])
    cfg = OmegaConf.to_object(typed)
    assert isinstance(cfg, ExperimentConfig)
    # the user's records (algorithms, families, rewards) before any lookup: a `--plan` process composed nothing
    import_modules(cfg.imports, dirs=cfg.import_dirs)
    return cfg, Plan.from_json(record)
