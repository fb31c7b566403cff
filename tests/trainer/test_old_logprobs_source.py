"""`algorithm.old_logprobs=rollout`: the native engine's own log-probs serve as the PPO ratio's pi_old, the actor
recomputes them only on the parity gate's steps. On the CPU (fp32, the engine shares the actor's weights) the
run must train like the recomputing one: the same first step exactly (both recompute on a gate step) and the
same losses afterwards to the engines' ~1e-6 log-prob difference."""

from __future__ import annotations

import json

import pytest

from tests.trainer.run_helpers import algorithmic, run

pytestmark = pytest.mark.slow

COMMON = ("+experiment=grpo_tiny_cpu", "trainer.total_steps=3", "trainer.save_every=0", "trainer.parity_every=2",
          "trainer.warmup_sft_steps=0")


def _rl(path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["phase"] == "rl"]


def test_rollout_logprobs_as_pi_old_train_like_the_recomputed_ones(tmp_path):
    run(tmp_path / "actor", *COMMON, "algorithm.old_logprobs=actor")
    run(tmp_path / "rollout", *COMMON, "algorithm.old_logprobs=rollout")
    actor, rollout = _rl(tmp_path / "actor" / "metrics.jsonl"), _rl(tmp_path / "rollout" / "metrics.jsonl")
    assert algorithmic(actor[0]) == algorithmic(rollout[0])  # step 1 is a gate step: recomputed on both sides
    for a, r in zip(actor[1:], rollout[1:], strict=True):
        gate = r["step"] % 2 == 1  # 1-based steps 1 and 3 are the gate's (parity_every=2)
        assert ("parity/max_abs" in r) == gate
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "reward/mean"):
            assert r[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), (r["step"], key)
        if not gate:  # the skipped pass: its stage is empty
            assert r["time/old_logprobs"] < 0.25 * a["time/old_logprobs"]
