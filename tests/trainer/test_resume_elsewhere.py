"""Resuming a real checkpoint: into a new `trainer.output_dir` (the warm-up's SFT model is read from the run
that wrote it and copied beside the new checkpoints), and in place from an older step (the records past that
step are logged once, not twice). The checkpoints written carry a completeness record and rank files that
read back as plain data."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hybridflow.trainer.checkpoint_record import COMPLETE_FILE, problem
from hybridflow.trainer.rank_state import rank_file, read_rank_state
from tests.trainer.run_helpers import run

pytestmark = pytest.mark.slow

QUICK = ("data.train_batch_size=16", "algorithm.mini_batch_size=16", "roles.actor.micro_batch_size=8",
         "roles.critic.micro_batch_size=4", "trainer.save_every=1", "trainer.total_steps=2")


def _logged_steps(out_dir, phase: str = "rl") -> Counter:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return Counter(r["step"] for r in records if r["phase"] == phase)


def test_resume_into_a_new_directory_and_in_place_from_an_older_step(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    run(first, *QUICK)
    step_1, step_2 = first / "checkpoints" / "step_000001", first / "checkpoints" / "step_000002"
    for ckpt in (step_1, step_2):
        assert (ckpt / COMPLETE_FILE).is_file() and problem(ckpt, world_size=4) is None
    assert read_rank_state(rank_file(step_2, 3))["step"] == 2

    moved = run(second, *QUICK, f"trainer.resume={step_1}")
    assert f"resumed from step 1 (checkpoint {step_1})" in moved.stdout
    assert _logged_steps(second) == {2: 1}
    assert (second / "sft_model" / "config.json").is_file()  # a later resume of `second` finds it there
    assert problem(second / "checkpoints" / "step_000002", world_size=4) is None

    sft_records = _logged_steps(first, "sft")
    run(first, *QUICK, f"trainer.resume={step_1}")  # in place: step 2 again, logged once
    assert _logged_steps(first) == {1: 1, 2: 1} and _logged_steps(first, "sft") == sft_records
