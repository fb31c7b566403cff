"""Faults of a real `python -m hybridflow.run` on the CPU default (slow: whole launches of tiny_cpu).

A rank's exception arrives as one line naming it; after Ctrl-C nothing of the run outlives it (the ranks'
checkpoint Managers, the fork server and the resource tracker included).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hybridflow.launch import free_port

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _command(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "hybridflow.run", "+experiment=tiny_cpu", f"trainer.output_dir={out}",
            f"distributed.master_port={free_port()}", *overrides]


def test_failing_reward_fn_is_named_in_the_last_line(tmp_path):
    (tmp_path / "boom_reward.py").write_text("def reward(batch):\n    raise ValueError('boom')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    result = subprocess.run(_command(tmp_path / "out", "reward.fn=boom_reward:reward", "trainer.total_steps=2"),
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank ") and "raised ValueError: boom at " in last, result.stderr[-3000:]
    assert "boom_reward.py:2 in reward" in last
    log = Path(last.split("traceback in ")[1].split(";")[0])
    assert "raise ValueError('boom')" in log.read_text()  # the full traceback is in the rank's log
    assert " E1" not in result.stderr and "Traceback" not in result.stderr  # torch's own copies are gone


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_nothing_of_a_run_outlives_ctrl_c_after_a_checkpoint(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(_command(out, "trainer.total_steps=50", "trainer.save_every=1"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while not list(out.glob("checkpoints/step_*")):  # the ranks' checkpoint Managers exist from here on
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.5)
        time.sleep(1)
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(family) >= 6  # fork server, 4 ranks, resource tracker (and the Managers)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("interrupted at step"), err[-2000:]
    deadline = time.monotonic() + 10
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(family), [" ".join(psutil.Process(p).cmdline())[:120] for p in _alive(family)]
    mentions = [p.pid for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not mentions
