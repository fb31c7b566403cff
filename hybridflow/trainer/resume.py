"""Which checkpoint a run resumes from, and whether it may: decided on the launching process, before ranks start.

Each checkpoint carries `fingerprint.json`: what must be the same to load it (model shapes, the weights at
`model.path`, algorithm, enabled roles, world size, the trained roles' meshes, optimizer layout, rollout lag, the
seed). Everything else (learning rates and their schedule, weight decay, KL settings, total_steps,
save/validation cadence, logging, the parity gate) may change on resume.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from hybridflow.config import ExperimentConfig
from hybridflow.config.model import ModelConfig
from hybridflow.errors import UserError
from hybridflow.placement import Plan
from hybridflow.role_records import Role, role_record, trained_roles
from hybridflow.trainer.checkpoint_record import is_recorded, problem

FINGERPRINT_FILE = "fingerprint.json"
METRICS_FILE, SAMPLES_FILE = "metrics.jsonl", "samples.jsonl"  # in trainer.output_dir, written by rank 0
SFT_MODEL_DIR = "sft_model"  # in trainer.output_dir: the warm-up's result, the reference model
FINAL_HF, FINAL_ADAPTER = "final_hf", "final_adapter"  # in trainer.output_dir: the actor at the end (trainer/loop.py)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def _step_dirs(root: Path) -> list[Path]:
    """Every checkpoint directory under `root`, oldest first (`.partial` ones, killed mid-write, never count)."""
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".partial"))


def _world_size(ckpt_dir: Path) -> int | None:
    record = ckpt_dir / FINGERPRINT_FILE
    try:
        return int(json.loads(record.read_text())["fingerprint"]["world size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoint_problem(ckpt_dir: Path) -> str | None:
    """Why `ckpt_dir` cannot be resumed from (a file missing or truncated), or None (see checkpoint_record)."""
    return problem(ckpt_dir, _world_size(ckpt_dir))


def latest_complete(root: Path) -> Path | None:
    """The newest checkpoint under `root` whose files are all there as saved."""
    return next((p for p in reversed(_step_dirs(root)) if checkpoint_problem(p) is None), None)


def _skipped(ckpt_dir: Path) -> list[tuple[Path, str]]:
    """The checkpoints newer than `ckpt_dir` beside it that `auto` passed over, with what is wrong with each."""
    newer = [p for p in _step_dirs(ckpt_dir.parent) if p.name > ckpt_dir.name]
    return [(p, why) for p in newer if (why := checkpoint_problem(p)) is not None]


def resume_point(cfg: ExperimentConfig) -> Path | None:
    """The checkpoint this run starts from: `trainer.resume` = auto (the newest complete one), never, or a
    directory. UserError for a directory that is not a complete checkpoint, and for `auto` when checkpoints
    exist but none is complete (starting over would write over their steps)."""
    mode = cfg.trainer.resume
    if mode == "never":
        return None
    if mode == "auto":
        root = Path(cfg.trainer.output_dir) / "checkpoints"
        found = latest_complete(root)
        if found is None and (held := _step_dirs(root)):
            raise UserError(f"trainer.resume: no complete checkpoint in {root} (the newest, {held[-1].name}: "
                            f"{checkpoint_problem(held[-1])}); set trainer.resume=DIR to a checkpoint of "
                            "another directory, or trainer.resume=never to start over (they move to previous/)")
        return found
    path = Path(mode)
    if not (path / "metadata.json").is_file() and not is_recorded(path):
        raise UserError(f"trainer.resume: {mode!r} is not a checkpoint directory (no metadata.json); "
                        "set auto, never or a checkpoints/step_N directory")
    why = checkpoint_problem(path)
    if why is not None:
        raise UserError(f"trainer.resume: checkpoint {path} is incomplete or corrupt ({why}); set "
                        "trainer.resume to an older checkpoints/step_N directory, or auto")
    return path


def _previous_dir(out: Path) -> Path:
    """Where what a run sets aside goes: `previous/<UTC time>/` in its output directory."""
    return out / "previous" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def set_aside_previous(cfg: ExperimentConfig) -> Path | None:
    """`trainer.resume=never` in a directory that holds a run: move its checkpoints, metrics, samples, final
    models and warm-up model to `previous/<UTC time>/` (nothing is deleted), so that a later `auto` resume cannot
    pick the old run's checkpoints and nothing of the old run mixes with the new one's. Returns where they went
    (None: nothing)."""
    out = Path(cfg.trainer.output_dir)
    names = ("checkpoints", METRICS_FILE, SAMPLES_FILE, FINAL_HF, FINAL_ADAPTER, SFT_MODEL_DIR)
    held = [out / name for name in names if (out / name).exists()]
    if cfg.trainer.resume != "never" or not held:
        return None
    dest = _previous_dir(out)
    dest.mkdir(parents=True)
    for path in held:
        path.rename(dest / path.name)
    return dest


def set_aside_newer(cfg: ExperimentConfig, start_from: Path) -> Path | None:
    """A run resuming an older checkpoint of its own directory (`trainer.resume=DIR`): move the checkpoints past
    it to `previous/<UTC time>/checkpoints/` (nothing is deleted), so that a later `auto` resume goes on from this
    run's steps, not from the abandoned ones. Returns where they went (None: nothing)."""
    root = Path(cfg.trainer.output_dir) / "checkpoints"
    if start_from.parent.resolve() != root.resolve():
        return None
    newer = [p for p in root.glob("step_*") if p.is_dir() and p.name > start_from.name]
    if not newer:
        return None
    dest = _previous_dir(Path(cfg.trainer.output_dir)) / "checkpoints"
    dest.mkdir(parents=True)
    for path in newer:
        path.rename(dest / path.name)
    return dest.parent


def exported(cfg: ExperimentConfig, plan: Plan) -> bool:
    """Whether the run's final model is in its output directory (written aside and renamed whole, trainer/loop.py):
    a run with an actor that was stopped after its last checkpoint, while exporting, has none yet."""
    return Role.ACTOR not in plan.meshes or (Path(cfg.trainer.output_dir) / FINAL_HF / "config.json").is_file()


def checkpoint_step(path: Path) -> int:
    """The RL step a checkpoint was written after (its fingerprint says; older ones: the directory name)."""
    record = path / FINGERPRINT_FILE
    if record.is_file():
        return int(json.loads(record.read_text())["step"])
    return int(path.name.removeprefix("step_"))


def _shape(model: ModelConfig, prefix: str) -> dict[str, Any]:
    return {f"{prefix}.{f.name}": getattr(model, f.name) for f in fields(model) if f.name != "path"}


# Fingerprint fields added after checkpoints were first written: a checkpoint without one is not compared on it.
ADDED_LATER = ("trainer.seed", "model.path weights", "trainer.warmup_sft_steps > 0")
DIGEST_SAMPLES, DIGEST_SAMPLE_BYTES = 16, 1 << 16


def weights_digest(model_dir: str) -> str:
    """The identity of the weights in `model_dir`: each safetensors file's name, size and 16 evenly spread 64 KiB
    samples. Another checkpoint of the same shape (another seed, a fine-tune) differs in them; reading every
    byte would take a minute at 8B. The reference and a LoRA run's frozen base are loaded from here on
    resume, so they must be the weights the checkpoint was trained against."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size};".encode())
        with path.open("rb") as f:
            for k in range(DIGEST_SAMPLES):
                f.seek(size * k // DIGEST_SAMPLES)
                digest.update(f.read(DIGEST_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def fingerprint(cfg: ExperimentConfig, plan: Plan) -> dict[str, Any]:
    """What a checkpoint of this run needs from a run that resumes it, keyed by the config field to change."""
    trained = [role for role in trained_roles() if role in plan.meshes]
    record: dict[str, Any] = {"algorithm.name": cfg.algorithm.name, "roles (enabled)": list(plan.meshes),
                              "world size": plan.world_size, **_shape(cfg.model, "model")}
    for role in trained:  # a trained role that may run its own model: that model's shape (critic_model)
        if (own := role_record(role).own_model_field) is not None:
            record.update(_shape(cfg.role_model(role), own))
    for role in trained:
        mesh = plan.meshes[role]
        record[f"roles.{role}.parallel"] = f"tp{mesh.tp} pp{mesh.pp} dp{mesh.dp} on ranks {list(mesh.ranks)}"
        record[f"roles.{role}.offload_optimizer"] = cfg.roles.get(role).offload_optimizer
        lora = cfg.roles.get(role).lora
        if lora.enabled:  # only then: fingerprints of full fine-tuning runs stay as they were
            record[f"roles.{role}.lora"] = f"rank {lora.rank} alpha {lora.alpha:g} on {','.join(lora.target_modules)}"
    record["trainer.rollout_lag"] = cfg.trainer.rollout_lag
    # the seed orders the prompts (and makes a built-in task's rows and a stand-in model): changed, the loader's
    # saved position would walk another order over other rows
    record["trainer.seed"] = cfg.trainer.seed
    record["model.path weights"] = weights_digest(cfg.model.path) if cfg.model.path else "stand-in (shape, seed)"
    # whether the reference is the warm-up's SFT model (a resume loads it only when warming up: resumed with 0,
    # the reference was silently the untrained model)
    record["trainer.warmup_sft_steps > 0"] = cfg.trainer.warmup_sft_steps > 0
    return record


def write_fingerprint(ckpt_dir: Path, step: int, record: dict[str, Any]) -> None:
    (ckpt_dir / FINGERPRINT_FILE).write_text(json.dumps({"step": step, "fingerprint": record}, indent=1))


def sft_model_dir(ckpt_dir: Path) -> Path:
    """The warm-up's SFT model (the reference model) of the run that wrote `ckpt_dir`, in that run's
    output directory: a run resuming it into another `trainer.output_dir` reads it there."""
    return ckpt_dir.parent.parent / SFT_MODEL_DIR


def _changes(ckpt_dir: Path, cfg: ExperimentConfig, plan: Plan) -> str | None:
    """Every fingerprint field that differs, as "field old -> new; ..." (None: none, or no fingerprint)."""
    record = ckpt_dir / FINGERPRINT_FILE
    if not record.is_file():  # written before fingerprints existed: megatron's own checks remain
        return None
    old, new = json.loads(record.read_text())["fingerprint"], fingerprint(cfg, plan)
    differ = [key for key in {**old, **new} if old.get(key) != new.get(key)
              and not (key in ADDED_LATER and key not in old)]

    def shown(value: Any) -> str:
        return ",".join(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else str(value)

    return "; ".join(f"{key} {shown(old.get(key))} -> {shown(new.get(key))}" for key in differ) or None


def check_resumable(ckpt_dir: Path, cfg: ExperimentConfig, plan: Plan) -> None:
    """One line naming what stops this run from loading `ckpt_dir`: a rank file that holds more than data,
    every fingerprint field that differs (old -> new) and the fix, or the warm-up's SFT model missing."""
    # torch is imported here, not at the top: the run command reports bad input before importing it.
    from hybridflow.trainer.rank_state import check_rank_file

    for path in sorted(ckpt_dir.glob("rank*.pt")):
        check_rank_file(path)
    changes = _changes(ckpt_dir, cfg, plan)
    if changes:
        raise UserError(f"trainer.resume: checkpoint {ckpt_dir} is of another run ({changes}); set "
                        "trainer.output_dir to a new directory, or trainer.resume=never to start over in this one "
                        "(its checkpoints and outputs move to previous/)")
    sft = sft_model_dir(ckpt_dir)
    if cfg.trainer.warmup_sft_steps and Role.REF in plan.meshes and not (sft / "config.json").is_file():
        raise UserError(f"trainer.resume: checkpoint {ckpt_dir} was trained after an SFT warm-up whose model (the "
                        f"reference) is not in {sft}; copy that run's {SFT_MODEL_DIR}/ there, or resume with "
                        "trainer.resume=never")


# ---- what the run command says about where a run stands --------------------------------------------
def metrics_size(output_dir: Path) -> int:
    """Bytes in metrics.jsonl now: records after this offset are the ones this launch writes."""
    path = output_dir / METRICS_FILE
    return path.stat().st_size if path.is_file() else 0


def drop_records_after(output_dir: Path, step: int) -> None:
    """Before a run resumed from `step` logs anything: remove the RL and validation records (and samples)
    past `step` that the interrupted run wrote after its checkpoint, so the resumed run's records of those
    steps are the only ones. Warm-up (`sft`) records are kept; a half-written last line goes too."""
    for name in (METRICS_FILE, SAMPLES_FILE):
        path = output_dir / name
        if not path.is_file():
            continue
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _kept(line, step)]
        if len(kept) < len(lines):
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text("".join(kept))
            tmp.replace(path)


def _kept(line: str, step: int) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return record.get("phase") == "sft" or int(record.get("step", 0)) <= step


def last_step_since(output_dir: Path, offset: int) -> int | None:
    """The last RL step logged after byte `offset` of metrics.jsonl (None: none yet)."""
    path = output_dir / METRICS_FILE
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
    """One line: the step and checkpoint resumed from, and each newer checkpoint passed over and why."""
    line = f"resumed from step {checkpoint_step(ckpt_dir)} (checkpoint {ckpt_dir}"
    line += ")" if is_recorded(ckpt_dir) else ", older than completeness records: its files are there, unverified)"
    skipped = [f"{p.name} is incomplete ({why})" for p, why in _skipped(ckpt_dir)]
    return f"{line}; skipped, and kept: {'; '.join(skipped)}" if skipped else line


def complete_line(ckpt_dir: Path, cfg: ExperimentConfig) -> str:
    out, step = Path(cfg.trainer.output_dir), checkpoint_step(ckpt_dir)
    return (f"hybridflow run: {cfg.name} is complete at step {step} (checkpoint {ckpt_dir}); outputs in {out} "
            f"(metrics.jsonl, final_hf/); to train on, raise trainer.total_steps (e.g. "
            f"trainer.total_steps={2 * max(step, 1)})")


def interrupted_line(step: int, cfg: ExperimentConfig, command: str) -> str:
    latest = latest_complete(Path(cfg.trainer.output_dir) / "checkpoints")
    return f"interrupted at step {step}; last checkpoint: {latest or 'none'}; resume with: {command}"
