"""SIGKILL of the launcher alone ends every rank and every engine process a rank started, within seconds.

The launch runs in a driver process of its own (tests/launch/launch_driver.py, scenario ranks_with_engines:
2 CPU ranks forked by the fork server, each hosting an engine process, then waiting forever).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigkill_of_the_launcher_ends_ranks_and_their_engine_processes(tmp_path):
    argv = [sys.executable, str(HERE / "launch_driver.py"), str(tmp_path), "ranks_with_engines"]
    driver = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out_dir = tmp_path / "ranks_with_engines"
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while len(list(out_dir.glob("rank*.json"))) < 2:
            assert driver.poll() is None, "the launch ended before its ranks were up"
            assert time.monotonic() < deadline, "ranks did not start their engine processes in 180 s"
            time.sleep(0.5)
        infos = [json.loads(p.read_text()) for p in out_dir.glob("rank*.json")]
        pids = [i["pid"] for i in infos] + [i["engine_pid"] for i in infos]
        assert all(_alive(pid) for pid in pids)
        os.kill(driver.pid, signal.SIGKILL)  # the launcher only: ranks are not in a group we signal
        driver.wait()
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in pids if _alive(pid)] == [], "processes outlived their launcher"
    finally:
        for pid in pids:  # do not leave them behind on failure
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
