"""A short real run of the CPU default: samples.jsonl holds validation and training generations, and the
responses end at the character tokenizer's <eos> (tiny_cpu sets no stop ids: the default found it)."""

import json

import pytest

from tests.trainer.run_helpers import run

MAX_NEW_TOKENS = 8  # tiny_cpu's rollout.max_new_tokens


@pytest.mark.slow
def test_samples_jsonl_and_responses_stop_at_eos(tmp_path):
    out = tmp_path / "run"
    run(out, "trainer.total_steps=2", "trainer.val_before_train=true", "data.val_size=8",
        "trainer.log_samples_every=1", "trainer.num_log_samples=4")
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in records] == [(0, "val")] * 4 + [(1, "train")] * 4 + [(2, "train")] * 4
    assert all(set(r) == {"step", "split", "prompt", "response", "reward", "response_tokens", "finish_reason"}
               for r in records)
    assert all(r["prompt"].startswith("<bos>") and r["prompt"].endswith(">") for r in records)
    for r in records:  # nothing after a stop token; a response without one ran to the limit
        if r["finish_reason"] == "stop":
            assert r["response"].endswith("<eos>") and "<eos>" not in r["response"][: -len("<eos>")]
        else:
            assert r["response_tokens"] == MAX_NEW_TOKENS and "<eos>" not in r["response"]
    # After the SFT warm-up the greedy answer is a digit and <eos> (right on ~81 % of prompts:
    # benchmarks/README.md, "Headline runs").
    assert sum(r["finish_reason"] == "stop" and r["response_tokens"] < MAX_NEW_TOKENS
               for r in records if r["split"] == "val") >= 2
