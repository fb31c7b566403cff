"""Checkpoint directories laid out as `hybridflow.trainer.checkpointing.save` leaves them, without training:
megatron's and torch's metadata, a tensor shard, one state file per rank, the fingerprint, the record last."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.config import load_experiment
from hybridflow.placement import plan_placement
from hybridflow.trainer.checkpoint_record import write_record
from hybridflow.trainer.rank_state import rank_file, write_rank_state
from hybridflow.trainer.resume import FINAL_HF, SFT_MODEL_DIR, fingerprint, step_dir, write_fingerprint


def checkpoint_of(out_dir: Path, experiment: str, step: int, *overrides: str, record: bool = True,
                  prompts: int | None = None) -> Path:
    """`out_dir`/checkpoints/step_N of `experiment` (and the warm-up's SFT model and final_hf/ beside it, as a run
    leaves them);
    `prompts`: the rank states hold a loader that went over that many prompts."""
    cfg = load_experiment(experiment, [f"trainer.output_dir={out_dir}", *overrides])
    plan = plan_placement(cfg)
    ckpt = step_dir(out_dir / "checkpoints", step)
    ckpt.mkdir(parents=True)
    (ckpt / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (ckpt / ".metadata").write_bytes(bytes(range(256)))
    (ckpt / "__0_0.distcp").write_bytes(bytes(8192))
    for rank in range(plan.world_size):
        loader = {} if prompts is None else {"loader": {"epoch": 0, "index": 8, "seed": 1, "num_rows": prompts}}
        write_rank_state(rank_file(ckpt, rank), {"step": step, "rng": {"torch": torch.get_rng_state()}, **loader})
    write_fingerprint(ckpt, step, fingerprint(cfg, plan))
    for done in (SFT_MODEL_DIR, FINAL_HF):  # the warm-up's model, and the final export of a finished run
        (out_dir / done).mkdir(exist_ok=True)
        (out_dir / done / "config.json").write_text("{}")
    if record:
        write_record(ckpt)
    return ckpt
