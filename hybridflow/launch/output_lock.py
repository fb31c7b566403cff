"""One run per output directory: `<trainer.output_dir>/run.lock`, held by the launching process for its life.

Two runs into one directory raced: the loser got an EADDRINUSE traceback, or (on another port) both wrote
checkpoints and metrics into the same files. The lock is `flock` on the file (the kernel drops it when the
holder dies, however it dies, so the lock of a dead run is simply taken over); the file names the holder's pid,
which the refusal quotes.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from hybridflow.errors import UserError

LOCK_NAME = "run.lock"

_held: dict[Path, int] = {}  # lock file -> descriptor, in the process that holds it (never closed: see below)


def hold_output_dir(output_dir: str | os.PathLike[str]) -> Path:
    """Lock `output_dir` for this process's lifetime (re-entrant within it) and return the lock file.

    Raises UserError naming the other run's pid when another live process holds it. The descriptor stays open
    until this process exits (it is not inherited by the ranks: Python opens it close-on-exec, and the ranks
    are spawned, or forked from a fork server that never saw it).
    """
    out = Path(output_dir).resolve()
    path = out / LOCK_NAME
    if path in _held:
        return path
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserError(f"trainer.output_dir: {out} is in use by another run (pid {holder}, {path}); wait for it "
                        "to end or stop it, or set trainer.output_dir to another directory") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[path] = fd
    return path
