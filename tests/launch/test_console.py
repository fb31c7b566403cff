"""A local launch's console: rank 0's output byte for byte (a progress bar stays one redrawn line, no
`[default_role0]:` prefix), other ranks' only in their log files, and no raw known warning from the fork
server's imports (the launching process notes it once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.launch import free_port

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def test_console_shows_rank0_as_written_and_no_fork_server_warnings(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "console_driver.py"), str(tmp_path), str(free_port())],
                          capture_output=True, timeout=180)
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()  # bytes: text mode would turn \r into \n
    assert proc.returncode == 0, stderr[-3000:]
    assert "\rsteps 1/2\rsteps 2/2\n" in stderr
    assert "rank 0 says hi\n" in stdout and "rank 1" not in stdout
    assert "[default_role" not in stdout + stderr
    assert "UserWarning" not in stderr
    assert stderr.count("Apex is not installed") == 1 and "note: Apex is not installed" in stderr
    (rank1_log,) = tmp_path.glob("**/attempt_0/1/stdout.log")
    assert rank1_log.read_text() == "rank 1 says hi\n"
