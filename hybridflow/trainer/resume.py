"""Which checkpoint a run resumes from, and whether it may: decided on the launching process, before ranks start.

Each checkpoint carries `fingerprint.json`: what must be the same to load it (model shapes, algorithm, enabled
roles, world size, the trained roles' meshes, optimizer layout, rollout lag). Everything else (learning rates,
total_steps, save/validation cadence, logging, the parity gate) may change on resume.
"""

from __future__ import annotations

import json
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from hybridflow.config import ExperimentConfig
from hybridflow.config.model import ModelConfig
from hybridflow.config.parallel import TRAINED_ROLES
from hybridflow.errors import UserError
from hybridflow.placement import Plan

FINGERPRINT_FILE = "fingerprint.json"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def latest_complete(root: Path) -> Path | None:
    """The newest fully written checkpoint under `root` (partial ones never count)."""
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".partial"))
    return done[-1] if done else None


def resume_point(cfg: ExperimentConfig) -> Path | None:
    """The checkpoint this run starts from: `trainer.resume` = auto (newest complete), never, or a directory."""
    mode = cfg.trainer.resume
    if mode == "never":
        return None
    if mode == "auto":
        return latest_complete(Path(cfg.trainer.output_dir) / "checkpoints")
    path = Path(mode)
    if not (path / "metadata.json").is_file():
        raise UserError(f"trainer.resume: {mode!r} is not a checkpoint directory (no metadata.json); "
                        "set auto, never or a checkpoints/step_N directory")
    return path


def set_aside_previous(cfg: ExperimentConfig) -> Path | None:
    """`trainer.resume=never` in a directory that holds a run: move its checkpoints and metrics to
    `previous/<UTC time>/` (nothing is deleted), so that a later `auto` resume cannot pick the old run's
    checkpoints and the new metrics do not mix with the old ones. Returns where they went (None: nothing)."""
    out = Path(cfg.trainer.output_dir)
    held = [out / name for name in ("checkpoints", "metrics.jsonl") if (out / name).exists()]
    if cfg.trainer.resume != "never" or not held:
        return None
    dest = out / "previous" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest.mkdir(parents=True)
    for path in held:
        path.rename(dest / path.name)
    return dest


def checkpoint_step(path: Path) -> int:
    """The RL step a checkpoint was written after (its fingerprint says; older ones: the directory name)."""
    record = path / FINGERPRINT_FILE
    if record.is_file():
        return int(json.loads(record.read_text())["step"])
    return int(path.name.removeprefix("step_"))


def _shape(model: ModelConfig, prefix: str) -> dict[str, Any]:
    return {f"{prefix}.{f.name}": getattr(model, f.name) for f in fields(model) if f.name != "path"}


def fingerprint(cfg: ExperimentConfig, plan: Plan) -> dict[str, Any]:
    """What a checkpoint of this run needs from a run that resumes it, keyed by the config field to change."""
    trained = [role for role in TRAINED_ROLES if role in plan.meshes]
    record: dict[str, Any] = {"algorithm.name": cfg.algorithm.name, "roles (enabled)": list(plan.meshes),
                              "world size": plan.world_size, **_shape(cfg.model, "model")}
    if "critic" in trained:
        record.update(_shape(cfg.role_model("critic"), "critic_model"))
    for role in trained:
        mesh = plan.meshes[role]
        record[f"roles.{role}.parallel"] = f"tp{mesh.tp} pp{mesh.pp} dp{mesh.dp} on ranks {list(mesh.ranks)}"
        record[f"roles.{role}.offload_optimizer"] = cfg.roles.get(role).offload_optimizer
    record["trainer.rollout_lag"] = cfg.trainer.rollout_lag
    return record


def write_fingerprint(ckpt_dir: Path, step: int, record: dict[str, Any]) -> None:
    (ckpt_dir / FINGERPRINT_FILE).write_text(json.dumps({"step": step, "fingerprint": record}, indent=1))


def check_resumable(ckpt_dir: Path, cfg: ExperimentConfig, plan: Plan) -> None:
    """One line naming every field that differs (old -> new) and the fix, when this run cannot load `ckpt_dir`.

    Checkpoints written before fingerprints existed are not checked.
    """
    record = ckpt_dir / FINGERPRINT_FILE
    if not record.is_file():
        return
    old, new = json.loads(record.read_text())["fingerprint"], fingerprint(cfg, plan)
    differ = [key for key in {**old, **new} if old.get(key) != new.get(key)]
    if not differ:
        return

    def shown(value: Any) -> str:
        return ",".join(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else str(value)

    changes = "; ".join(f"{key} {shown(old.get(key))} -> {shown(new.get(key))}" for key in differ)
    raise UserError(f"trainer.resume: checkpoint {ckpt_dir} is of another run ({changes}); set "
                    "trainer.output_dir to a new directory, or trainer.resume=never to start over in this one "
                    "(its checkpoints and metrics move to previous/)")


# ---- what the run command says about where a run stands --------------------------------------------
def metrics_size(output_dir: Path) -> int:
    """Bytes in metrics.jsonl now: records after this offset are the ones this launch writes."""
    path = output_dir / "metrics.jsonl"
    return path.stat().st_size if path.is_file() else 0


def last_step_since(output_dir: Path, offset: int) -> int | None:
    """The last RL step logged after byte `offset` of metrics.jsonl (None: none yet)."""
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    with path.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    steps = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the line rank 0 was writing when it stopped
            continue
        if record.get("phase") == "rl":
            steps.append(int(record["step"]))
    return steps[-1] if steps else None


def resumed_line(ckpt_dir: Path) -> str:
    return f"resumed from step {checkpoint_step(ckpt_dir)} (checkpoint {ckpt_dir})"


def complete_line(ckpt_dir: Path, cfg: ExperimentConfig) -> str:
    out, step = Path(cfg.trainer.output_dir), checkpoint_step(ckpt_dir)
    return (f"hybridflow run: {cfg.name} is complete at step {step} (checkpoint {ckpt_dir}); outputs in {out} "
            f"(metrics.jsonl, final_hf/); to train on, raise trainer.total_steps (e.g. "
            f"trainer.total_steps={2 * max(step, 1)})")


def interrupted_line(step: int, cfg: ExperimentConfig, command: str) -> str:
    latest = latest_complete(Path(cfg.trainer.output_dir) / "checkpoints")
    return f"interrupted at step {step}; last checkpoint: {latest or 'none'}; resume with: {command}"
