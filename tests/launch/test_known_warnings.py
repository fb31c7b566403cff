"""Known third-party warnings print once, as one `note:` line, on rank 0 only, with their full text once per
rank in the run's logs; unknown ones pass through."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import logging, sys, warnings
from hybridflow.launch.known_warnings import quiet_known_noise
logging.basicConfig()
quiet_known_noise(log_dir=sys.argv[1])
for _ in range(3):
    warnings.warn("Apex is not installed. Falling back to Torch Norm")
    logging.getLogger("megatron.core.models.gpt.gpt_model").warning("GPTModel IS DEPRECATED. Please migrate")
    warnings.warn("torch.foo is deprecated, use torch.bar", FutureWarning)
warnings.warn("something nobody listed")
"""
# What a resumed tiny_cpu run printed raw, twice per rank, before these were known (issue #41): torch's
# distributed-checkpoint reader under megatron-core's dist_checkpointing.load.
RESUME_WARNINGS = (
    "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a single process.",
    "The argument order of load has been changed. Please check the document to avoid future breakages.",
    "Please use DTensor instead and we are deprecating ShardedTensor.",
)


def _stderr(rank: str, log_dir: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log_dir)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"RANK": rank, "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.splitlines()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_known_warnings_once_on_rank_0(rank, tmp_path):
    lines = _stderr(rank, tmp_path)
    notes = [line for line in lines if line.startswith("note:")]
    if rank == "0":
        assert len(notes) == 3, lines
        assert "Apex is not installed" in notes[0] and "GPTModel deprecated" in notes[1]
        assert "torch.foo is deprecated" in notes[2]  # the catch-all entry says which API
    else:
        assert notes == []
    assert not any("Falling back" in line or "IS DEPRECATED" in line for line in lines)
    assert sum("something nobody listed" in line for line in lines) == 1  # unknown: unchanged, every rank


@pytest.mark.parametrize("rank", ["0", "1"])
def test_full_text_once_per_rank_in_its_log(rank, tmp_path):
    lines = _stderr(rank, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [f"warnings_rank{rank}.txt"]
    text = (tmp_path / f"warnings_rank{rank}.txt").read_text()
    for full in ("Apex is not installed. Falling back to Torch Norm", "GPTModel IS DEPRECATED. Please migrate",
                 "torch.foo is deprecated, use torch.bar"):
        assert text.count(full) == 1, text  # warned three times, written once
    assert "UserWarning at <string>:" in text and "FutureWarning at <string>:" in text  # category, file:line
    assert "logger megatron.core.models.gpt.gpt_model (WARNING)" in text
    assert "something nobody listed" not in text  # unknown warnings stay on the console only
    if rank == "0":  # the note says where the full text is
        notes = [line for line in lines if line.startswith("note:")]
        assert all(str(tmp_path / "warnings_rank0.txt") in note for note in notes), notes


def test_a_resumed_runs_checkpoint_reader_warnings_are_notes(tmp_path):
    script = ("import sys, warnings\nfrom hybridflow.launch.known_warnings import quiet_known_noise\n"
              "quiet_known_noise(log_dir=sys.argv[1])\n"
              + "".join(f"warnings.warn({m!r}, {c})\n" * 2 for m, c in zip(
                  RESUME_WARNINGS, ("UserWarning", "UserWarning", "FutureWarning"), strict=True)))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"RANK": "0", "PATH": ""})
    lines = proc.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("note:") for line in lines), lines
