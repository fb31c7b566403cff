"""Two runs into one trainer.output_dir: the second refuses in one line naming the first's pid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.errors import UserError
from hybridflow.launch.output_lock import LOCK_NAME, hold_output_dir

REPO = Path(__file__).resolve().parents[2]
# A process that holds the directory as a run's launcher does, says so, and waits for stdin to close.
HOLDER = ("import sys; from hybridflow.launch.output_lock import hold_output_dir; hold_output_dir(sys.argv[1]); "
          "print('held', flush=True); sys.stdin.read()")


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.run", "+experiment=tiny_cpu",
                           f"trainer.output_dir={out}", *extra], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_second_run_into_a_held_directory_is_refused_naming_the_pid(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = _run(tmp_path, "--plan-only")
        assert result.returncode == 2, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: trainer.output_dir:"), lines
        assert f"in use by another run (pid {holder.pid}," in lines[0]
        assert not (tmp_path / "plan.json").exists()  # refused before writing anything
        with pytest.raises(UserError, match=f"pid {holder.pid}"):  # the same in-process
            hold_output_dir(tmp_path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # The holder has exited: its lock went with it and the next run takes the directory over.
    hold_output_dir(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_lock_file_of_a_dead_run_is_taken_over(tmp_path):
    (tmp_path / LOCK_NAME).write_text("999999999\n")  # a pid no process has; nobody holds the flock
    assert hold_output_dir(tmp_path) == (tmp_path / LOCK_NAME).resolve()
    assert hold_output_dir(tmp_path) == (tmp_path / LOCK_NAME).resolve()  # re-entrant in one process
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
