"""A checkpoint's per-rank state file (`rankNNNNN.pt`): tensors and plain data, read without running any code.

The file holds RNG states, the data position, the KL controller, LR schedules and, at rollout lag 1, the batch
generated before the checkpoint. It is read with `torch.load(weights_only=True)`, which only rebuilds tensors,
containers and numbers, plus the few types below, allowed by name: the lag-1 `StepBatch` (a dataclass of
tensors and dataset rows), numpy's array (numpy's RNG state is one) and `Role` (the LR schedules are keyed by
it; a member is its name as a string). A file that asks for anything else is
refused with one line naming it, before anything in it runs.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridflow.data.step_batch import StepBatch
from hybridflow.errors import UserError
from hybridflow.role_records import Role

# The types a rank file may contain beyond what weights_only allows anyway. numpy's array pickles through its
# module's `_reconstruct`, taken from numpy's own reduction so no private module path is spelled here.
_ALLOWED = [StepBatch, Role, np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, np.dtypes.UInt32DType]
# Types allowed under the name an older program wrote them with: Role lived in hybridflow.config.parallel.
_FORMER_NAMES = [(Role, "hybridflow.config.parallel.Role")]
_ALLOWED_NAMES = {f"{t.__module__}.{t.__qualname__}" for t in _ALLOWED} | {name for _, name in _FORMER_NAMES}


def rank_file(ckpt_dir: Path, rank: int) -> Path:
    return ckpt_dir / f"rank{rank:05d}.pt"


def write_rank_state(path: Path, state: dict[str, Any]) -> None:
    torch.save(state, path)


def _refused(path: Path, what: str) -> UserError:
    return UserError(f"trainer.resume: {path} {what}; point trainer.resume at a checkpoint this program wrote "
                     "(or trainer.resume=never)")


def _gist(err: Exception) -> str:
    """The line of torch's (long, advisory) message that says what was wrong, first sentence only."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    line = next((line for line in lines if "Unsupported global" in line or "GLOBAL" in line), lines[0])
    return line.split(". ")[0].rstrip(".")


def check_rank_file(path: Path) -> None:
    """Refuse `path` (UserError) if its pickle names any type outside the allowed ones. Reads the pickle's
    opcodes only (torch's own scan, no tensor data, nothing executed): cheap enough for the launching process
    to look at every rank's file before starting them."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError) as err:
        raise _refused(path, f"is not a rank file torch wrote, or is truncated ({_gist(err)})") from None
    foreign = sorted(set(unsafe) - _ALLOWED_NAMES)
    if foreign:
        raise _refused(path, f"asks to run or build {', '.join(foreign)}, which a rank state never holds "
                             "(refused; nothing in it ran)")


def read_rank_state(path: Path) -> dict[str, Any]:
    """The state in `path`, rebuilt from tensors and plain data only; UserError naming the file otherwise."""
    try:
        with torch.serialization.safe_globals([*_ALLOWED, *_FORMER_NAMES]):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise _refused(path, f"holds more than tensors and plain data (refused; nothing in it ran: {_gist(err)})") \
            from None
    except (RuntimeError, EOFError, OSError) as err:
        raise _refused(path, f"is not a rank file torch wrote, or is truncated ({_gist(err)})") from None
