"""End to end on CPU: tiny_cpu (4 gloo ranks; actor TP2 x DP2, critic TP1 x DP4) with sequence packing in every
model role runs RL steps, and its first step (same seed, so the same rollout) gives the padded run's losses,
KL and parity."""

from __future__ import annotations

import math

import pytest

from tests.trainer.run_helpers import algorithmic, rl_records, run

pytestmark = pytest.mark.slow

COMMON = ("data.train_batch_size=16", "algorithm.mini_batch_size=16", "roles.actor.micro_batch_size=8",
          "roles.critic.micro_batch_size=4", "trainer.warmup_sft_steps=0", "trainer.total_steps=2",
          "trainer.save_every=0")
# the longest sample is 24 tokens (16 prompt + 8 response); ref follows the actor's budget
PACKED = ("roles.actor.max_tokens_per_micro_batch=48", "roles.critic.max_tokens_per_micro_batch=32")


def test_packed_run_matches_the_padded_run(tmp_path):
    run(tmp_path / "padded", *COMMON)
    run(tmp_path / "packed", *COMMON, *PACKED)
    padded, packed = rl_records(tmp_path / "padded"), rl_records(tmp_path / "packed")
    assert [r["step"] for r in packed] == [1, 2]
    assert all(math.isfinite(v) for r in packed for v in r.values() if isinstance(v, float))
    first, reference = algorithmic(packed[0]), algorithmic(padded[0])
    assert first.keys() == reference.keys()
    for key, value in reference.items():
        if isinstance(value, float):
            assert first[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
