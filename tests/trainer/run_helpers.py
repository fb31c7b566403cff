"""Run `python -m hybridflow.run` as a user would, in a subprocess, and read what it wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hybridflow.launch import free_port

REPO = Path(__file__).resolve().parents[2]
# Fields that measure the machine, not the algorithm: they differ between identical runs.
MACHINE_FIELDS = ("time/", "tokens_per_s", "step_time_s", "peak_memory", "rollout/generate_s")


def run_command(out_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "hybridflow.run", f"trainer.output_dir={out_dir}",
            f"distributed.master_port={free_port()}", *overrides]


def run(out_dir: Path, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    result = subprocess.run(run_command(out_dir, *overrides), cwd=REPO, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def start(out_dir: Path, *overrides: str) -> subprocess.Popen:
    """Start a run in its own process group (so a kill reaches every rank)."""
    return subprocess.Popen(run_command(out_dir, *overrides), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def kill_after_step(proc: subprocess.Popen, out_dir: Path, step: int, timeout: float = 600) -> None:
    """SIGKILL the whole run as soon as metrics.jsonl shows rl step `step`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in rl_records(out_dir)):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"step {step} never appeared")


def rl_records(out_dir: Path) -> list[dict]:
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written while we read
            continue
        if record.get("phase") == "rl":
            records.append(record)
    return records


def algorithmic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(MACHINE_FIELDS)}
