"""Checkpoint and resume: trained roles through megatron-core dist_checkpointing, the rest per rank.

Any placement checkpoints: each trained role's state is written by the role's own ranks (its common state
by its first rank), so global rank 0 need not hold the actor or the critic.

A checkpoint is written to `step_N.partial/` and renamed to `step_N/` only after every rank finished, so
a run killed mid-write leaves a `.partial` directory that `resume=auto` never picks. Rank 0 adds the run's
fingerprint (`hybridflow.trainer.resume`), checked before a later run resumes from it, and last, just before the
rename, the completeness record (`hybridflow.trainer.checkpoint_record`) that finds a truncated or missing file
before a later run loads it. Per-rank state is tensors and plain data (`hybridflow.trainer.rank_state`).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

from hybridflow.role_records import trained_roles
from hybridflow.roles.model_role import ModelRole
from hybridflow.trainer.checkpoint_record import write_record
from hybridflow.trainer.rank_state import rank_file, read_rank_state, write_rank_state
from hybridflow.trainer.resume import step_dir, write_fingerprint
from megatron_adapters.checkpoint import load_models, save_models


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "tracker": get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def save(root: Path, step: int, roles: dict[str, ModelRole], rank_state: dict, fingerprint: dict) -> Path:
    """Collective: write step `step` (trained roles + this rank's RNG/loader/controller state).

    A complete checkpoint of the same step is replaced (a run started over with `trainer.resume=never`)."""
    final, partial = step_dir(root, step), step_dir(root, step).with_name(step_dir(root, step).name + ".partial")
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    held = [name for name in trained_roles() if name in roles]
    save_models(partial, {name: (roles[name].model, roles[name].optimizer.optimizer) for name in held})
    schedulers = {name: roles[name].optimizer.scheduler.state_dict() for name in held}
    write_rank_state(rank_file(partial, dist.get_rank()), {**rank_state, "rng": _rng_state(),
                                                           "schedulers": schedulers})
    dist.barrier()
    if dist.get_rank() == 0:
        write_fingerprint(partial, step, fingerprint)
        write_record(partial)  # last: every file of the checkpoint is written
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    dist.barrier()
    return final


def load(path: Path, roles: dict[str, ModelRole]) -> dict:
    """Collective: restore trained roles and return this rank's saved state (RNG restored already).

    The rank state is read first: a file that is not plain data stops this rank before any collective."""
    rank_state = read_rank_state(rank_file(path, dist.get_rank()))
    load_models(path, {name: (roles[name].model, roles[name].optimizer.optimizer)
                       for name in trained_roles() if name in roles})
    for name, sched in rank_state.pop("schedulers").items():
        roles[name].optimizer.scheduler.load_state_dict(sched)
    _set_rng_state(rank_state.pop("rng"))
    return rank_state
