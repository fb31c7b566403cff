"""Single-turn results are bit for bit those of main before the batch carried token kinds (a loss mask apart
from the lengths): the CPU default (PPO with a critic, padded; and one step off-policy with the rollout on
ranks of its own) and GRPO (packed, with a reference), same seed, every metric of every step equal.

The expected records in data/single_turn_main/ were written by main at c9eafa2 (response_mask era) on this
2-core CPU machine with the commands of `RUNS` (fields that measure the machine dropped, as `algorithmic`
does); samples.jsonl of the padded PPO run too. A metric added since (`NEW_METRICS`) must be the
single-turn value it is defined to take.

Since the LM head runs at the loss tokens only (megatron_adapters/output_positions.py) and micro-batches are cut
by length (hybridflow/roles/micro_batching.py), the same gradients and log-probs are summed in another order:
float metrics agree to fp32 noise (`FLOAT_RTOL`, or `FLOAT_ATOL` for noise-sized figures such as parity/max_abs,
5e-7 -> 1e-6), everything else (steps, token counts, samples) stays exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.run_helpers import algorithmic, run

pytestmark = pytest.mark.slow

EXPECTED = Path(__file__).parent / "data" / "single_turn_main"
COMMON = ("trainer.total_steps=3", "trainer.save_every=0", "trainer.parity_every=1")
RUNS = {
    "ppo_padded": ("trainer.log_samples_every=1",),
    "ppo_lag1_split": ("placement=split_rollout", "trainer.rollout_lag=1"),  # the rollout on its own ranks
    "grpo_packed": ("+experiment=grpo_tiny_cpu", "roles.actor.max_tokens_per_micro_batch=64",
                    "roles.ref.max_tokens_per_micro_batch=64"),
}
NEW_METRICS = {"observation_token_share": 0.0}  # single-turn: no observation tokens
FLOAT_RTOL, FLOAT_ATOL = 1e-4, 1e-5


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_metrics_equal_mains_step_for_step(tmp_path, name):
    run(tmp_path, *RUNS[name], *COMMON)
    got = [algorithmic(r) for r in _records(tmp_path / "metrics.jsonl")]
    want = _records(EXPECTED / f"{name}.jsonl")
    assert [(r["phase"], r["step"]) for r in got] == [(r["phase"], r["step"]) for r in want]
    for mine, main in zip(got, want, strict=True):
        added = {k: mine.pop(k) for k in NEW_METRICS if k in mine and k not in main}
        assert mine.keys() == main.keys(), (mine["phase"], mine["step"])
        for key, value in main.items():
            where = (mine["phase"], mine["step"], key)
            if isinstance(value, float):
                assert mine[key] == pytest.approx(value, rel=FLOAT_RTOL, abs=FLOAT_ATOL), where
            else:
                assert mine[key] == value, where
        assert added == ({} if main["phase"] != "rl" else NEW_METRICS)
    if name == "ppo_padded":
        assert (tmp_path / "samples.jsonl").read_text() == (EXPECTED / "ppo_padded_samples.jsonl").read_text()
