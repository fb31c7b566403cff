"""Known third-party warnings print once, as one `note:` line, on rank 0 only; unknown ones pass through."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import logging, warnings
from hybridflow.noise import quiet_known_noise
logging.basicConfig()
quiet_known_noise()
for _ in range(3):
    warnings.warn("Apex is not installed. Falling back to Torch Norm")
    logging.getLogger("megatron.core.models.gpt.gpt_model").warning("GPTModel IS DEPRECATED. Please migrate")
    warnings.warn("torch.foo is deprecated, use torch.bar", FutureWarning)
warnings.warn("something nobody listed")
"""


def _stderr(rank: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"RANK": rank, "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.splitlines()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_known_warnings_once_on_rank_0(rank):
    lines = _stderr(rank)
    notes = [line for line in lines if line.startswith("note:")]
    if rank == "0":
        assert len(notes) == 3, lines
        assert "Apex is not installed" in notes[0] and "GPTModel deprecated" in notes[1]
        assert "torch.foo is deprecated" in notes[2]  # the catch-all entry says which API
    else:
        assert notes == []
    assert not any("Falling back" in line or "IS DEPRECATED" in line for line in lines)
    assert sum("something nobody listed" in line for line in lines) == 1  # unknown: unchanged, every rank
