"""Where a benchmark figure came from: date, commit, host and device."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit() -> str:
    """Short HEAD, with `-dirty` when tracked files differ from it (figures from uncommitted code).

    `HYBRIDFLOW_COMMIT` wins when set: the GPU machine's copy of the tree carries stale git metadata, so a
    run there names the commit it was sent from (`HYBRIDFLOW_COMMIT=$(git rev-parse --short HEAD)` here).
    """
    if os.environ.get("HYBRIDFLOW_COMMIT"):
        return os.environ["HYBRIDFLOW_COMMIT"]
    head = _git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no").strip() else "")


def device() -> str:
    """'N x <GPU name>' from nvidia-smi, else the CPU and its core count."""
    if shutil.which("nvidia-smi"):
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True).stdout.strip().splitlines()
        if names:
            return f"{len(names)} x {names[0]}"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def provenance() -> dict:
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(),
            "host": platform.node(), "device": device()}
