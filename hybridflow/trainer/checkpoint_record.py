"""A checkpoint's completeness record, `complete.json`: written last, checked before a run resumes from it.

The record lists every file of the checkpoint with its size, and the sha256 of the small ones (rank state,
metadata, fingerprint; tensor shards are only sized: every process that resumes re-checks, and hashing
gigabytes costs minutes). A
truncated, missing or replaced file is then found on the launching process, before any rank starts, instead
of as a peer's failure in the middle of loading.

Checkpoints written before records existed have none. A checkpoint is renamed from `.partial` only after every
rank finished, and the record is written before that rename, so a missing record means older code (or a
partial copy of the directory): such a checkpoint is used, unverified, when the files a load needs are there,
since refusing every checkpoint of an older run would leave nothing to resume from.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

COMPLETE_FILE = "complete.json"
FORMAT = 1
HASHED_BELOW = 1 << 20  # bytes: files this small are hashed as well as sized
# What a checkpoint without a record needs at least: megatron's and torch's distributed-checkpoint metadata and
# rank 0's state (the fingerprint names the world size, when there is one, so every rank's file is asked for).
_UNRECORDED_NEEDS = ("metadata.json", ".metadata")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entry(path: Path) -> dict[str, int | str]:
    size = path.stat().st_size
    return {"size": size, "sha256": _sha256(path)} if size < HASHED_BELOW else {"size": size}


def write_record(ckpt_dir: Path) -> None:
    """Record every file now in `ckpt_dir` (call when all of it is written, before it is renamed final)."""
    files = {str(p.relative_to(ckpt_dir)): _entry(p) for p in sorted(ckpt_dir.rglob("*"))
             if p.is_file() and p.name != COMPLETE_FILE}
    tmp = ckpt_dir / f".{COMPLETE_FILE}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))
    tmp.rename(ckpt_dir / COMPLETE_FILE)


def is_recorded(ckpt_dir: Path) -> bool:
    return (ckpt_dir / COMPLETE_FILE).is_file()


def problem(ckpt_dir: Path, world_size: int | None = None) -> str | None:
    """What makes `ckpt_dir` unusable ("rank00001.pt is 812 bytes, 20135 when saved"), or None.

    Without a record (older checkpoints), only the presence of the files every load reads is checked;
    `world_size` (from the checkpoint's fingerprint) says how many rank files that is.
    """
    if not ckpt_dir.is_dir():
        return "it is not a directory"
    if not is_recorded(ckpt_dir):
        needs = [*_UNRECORDED_NEEDS, *(f"rank{r:05d}.pt" for r in range(world_size or 1))]
        missing = [name for name in needs if not (ckpt_dir / name).is_file()]
        if not any(ckpt_dir.glob("*.distcp")):
            missing.append("*.distcp")
        return f"{', '.join(missing)} missing (no {COMPLETE_FILE}: written before records)" if missing else None
    try:
        files = json.loads((ckpt_dir / COMPLETE_FILE).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its {COMPLETE_FILE} is unreadable ({err})"
    for name, saved in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"its {COMPLETE_FILE} names {name!r}, outside the checkpoint"
        path = ckpt_dir / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != saved["size"]:
            return f"{name} is {size} bytes, {saved['size']} when saved"
        if "sha256" in saved and _sha256(path) != saved["sha256"]:
            return f"{name} differs from the file saved (sha256)"
    return None
