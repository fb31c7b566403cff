"""Value and reward heads: one scalar per token; a reward model matches HF *ForSequenceClassification."""

import pytest
import torch
from transformers import LlamaConfig

from megatron_adapters.model import (
    build_gpt,
    model_shape,
    rope_settings,
    transformer_config_from_hf,
)
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import (
    LLAMA,
    pipeline_forward,
    save_tiny_model,
    token_batch,
)


def _heads_rank(reward_dir, causal_dir, ids):
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.process_groups import build_role_groups

    out = []
    for tp, pp in [(2, 1), (1, 2)]:
        pg = build_role_groups([0, 1], tp=tp, pp=pp, dp=1)
        reward = build_gpt(reward_dir, pg, head="reward")
        assert load_hf_weights(reward, reward_dir) == []
        scores = pipeline_forward(reward, ids)
        critic = build_gpt(causal_dir, pg, head="value")
        skipped = load_hf_weights(critic, causal_dir)  # critic from a causal LM: fresh value head
        values = pipeline_forward(critic, ids)
        if scores is not None:
            out.append((tp, pp, scores, values, skipped))
    return out


def test_reward_head_matches_hf_and_value_head_is_scalar(tmp_path):
    hf = save_tiny_model("llama", tmp_path / "rm", seed=9, head="score")
    save_tiny_model("llama", tmp_path / "lm", seed=10)
    ids = token_batch(hf.config.vocab_size).clamp(min=1)  # no pad tokens: HF pools the last position
    with torch.no_grad():
        ref = hf(ids).logits[:, 0]
    reports = [
        r
        for rank in run_distributed(_heads_rank, 2, args=(str(tmp_path / "rm"), str(tmp_path / "lm"), ids))
        for r in rank
    ]
    assert {(tp, pp) for tp, pp, *_ in reports} == {(2, 1), (1, 2)}
    for tp, pp, scores, values, skipped in reports:
        assert scores.shape == (*ids.shape, 1) and values.shape == (*ids.shape, 1)
        assert (scores[:, -1, 0] - ref).abs().max() <= 1e-4, f"tp{tp} pp{pp}"
        assert skipped == ["score.weight"]


def test_config_mapping_reads_gqa_bias_and_rope():
    shape = model_shape(LlamaConfig(**LLAMA))
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.qkv_bias) == (8, 4, 8, False)
    cfg = transformer_config_from_hf(LlamaConfig(**LLAMA), tp=2, pp=2)
    assert (cfg.num_query_groups, cfg.kv_channels, cfg.ffn_hidden_size, cfg.gated_linear_unit) == (
        4,
        8,
        96,
        True,
    )
    rope = rope_settings(LlamaConfig(**LLAMA))
    assert rope.llama3_scaling and rope.factor == 8.0 and rope.base == 500000.0


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="^tp: 8 must divide"):
        transformer_config_from_hf(LlamaConfig(**LLAMA), tp=8)
    with pytest.raises(ValueError, match="^pp: 3 must divide"):
        transformer_config_from_hf(LlamaConfig(**LLAMA), pp=3)
    yarn = {
        **LLAMA,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    }
    with pytest.raises(ValueError, match="^rope_parameters: rope_type 'yarn'"):
        rope_settings(LlamaConfig(**yarn))
    with pytest.raises(ValueError, match="^head: 'policy' is not a head"):
        build_gpt(LlamaConfig(**LLAMA), pg_collection=None, head="policy")
    with pytest.raises(ValueError, match="^attention_bias: LlamaForCausalLM with attention biases"):
        model_shape(LlamaConfig(**LLAMA, attention_bias=True))

