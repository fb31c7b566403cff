"""scripts/setup_env.sh: says clearly and exits 1 when no Python 3.12 can be found; is quick when set up."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "setup_env.sh"


def test_no_python312_is_a_clear_failure(tmp_path):
    # A copy of the script in an empty "repo" (no .venv) with a PATH holding no 3.12, pyenv or uv.
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "setup_env.sh")
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "dirname", "grep", "tail"):
        if path := shutil.which(tool):
            (bare / tool).symlink_to(path)
    proc = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup_env.sh")],
        env={"PATH": str(bare)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "no Python 3.12 found" in proc.stderr
    assert not (tmp_path / ".venv").exists()


def test_rerun_in_place_is_a_no_op():
    if not (REPO / ".venv" / "bin" / "python").exists():
        # Re-running needs a first run here (CI's does); without one the script would install torch (minutes).
        pytest.skip("this checkout has no .venv: scripts/setup_env.sh has not run here")
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "is ready" in proc.stdout or "done" in proc.stdout
