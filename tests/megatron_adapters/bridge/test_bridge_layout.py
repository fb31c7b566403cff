"""Target layouts from full HF tensors (no communication): vLLM / native shards vs a plain-torch reference."""

import pytest
import torch

from megatron_adapters.bridge import (
    ShardGeometry,
    TargetFormat,
    bridge_tensors,
    hf_from_shards,
    shards_from_hf,
)
from megatron_adapters.bridge.shard_ranges import RowCopy, coalesce_strided, plan_copies
from megatron_adapters.model import model_shape
from tests.megatron_adapters.bridge.bridge_fixtures import (
    reference_native_shard,
    reference_vllm_shard,
    tiny_llama_gqa,
    tiny_qwen2_tied,
    tiny_qwen3_wide_heads,
)

MODELS = {"llama_gqa": tiny_llama_gqa, "qwen2_tied": tiny_qwen2_tied, "qwen3_wide_heads": tiny_qwen3_wide_heads}


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vllm_shards_match_reference_and_invert(model, tp):
    cfg, state = MODELS[model]()
    shape = model_shape(cfg)
    geometry = ShardGeometry.vllm(shape, tp)
    shards = [shards_from_hf(state, shape, geometry, r) for r in range(tp)]
    for r in range(tp):
        _assert_same(shards[r], reference_vllm_shard(cfg, state, tp, r))
    _assert_same(hf_from_shards(shards, shape, geometry), state)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("tp", [1, 2])
def test_native_shards_match_reference(model, tp):
    cfg, state = MODELS[model]()
    shape = model_shape(cfg)
    geometry = ShardGeometry.megatron(shape, tp)
    for r in range(tp):
        _assert_same(shards_from_hf(state, shape, geometry, r), reference_native_shard(cfg, state, tp, r))


def test_vllm_names_cover_every_hf_tensor_once():
    cfg, state = tiny_qwen2_tied()
    shape = model_shape(cfg)
    names = [t.name(TargetFormat.VLLM) for t in bridge_tensors(shape)]
    assert len(names) == len(set(names))
    assert "model.layers.0.self_attn.qkv_proj.bias" in names and "lm_head.weight" not in names
    hf_names = sorted(n for t in bridge_tensors(shape) for n in t.entry.hf)
    assert hf_names == sorted(state)


def test_vllm_qwen3_norms_are_whole_head_dim_tensors_on_every_rank():
    """vLLM's Qwen3Attention holds `q_norm` / `k_norm` as RMSNorm(head_dim): HF's names, not TP-split."""
    cfg, state = tiny_qwen3_wide_heads()
    shape = model_shape(cfg)
    geometry = ShardGeometry.vllm(shape, 2)
    for rank in range(2):
        shard = shards_from_hf(state, shape, geometry, rank)
        for p in "qk":
            assert torch.equal(shard[f"model.layers.1.self_attn.{p}_norm.weight"],
                               state[f"model.layers.1.self_attn.{p}_norm.weight"])
            assert shard[f"model.layers.1.self_attn.{p}_norm.weight"].shape == (16,)
        # q rows of this rank: 2 heads x 16; k and v: one kv head each
        assert shard["model.layers.0.self_attn.qkv_proj.weight"].shape == (2 * 16 + 2 * 16, 32)
        assert shard["model.layers.0.self_attn.o_proj.weight"].shape == (32, 2 * 16)


def test_vllm_padding_rule_and_bad_tp():
    cfg, _ = tiny_llama_gqa(vocab=1100)
    shape = model_shape(cfg)
    assert ShardGeometry.vllm(shape, 2).padded_vocab == 1152  # 1100 -> next multiple of 64
    assert ShardGeometry.megatron(shape, 4).padded_vocab == 1536  # 1100 -> next multiple of 128 * 4
    with pytest.raises(ValueError, match="tp"):
        ShardGeometry.vllm(shape, 5)


def test_plan_copies_splits_at_piece_boundaries():
    copies = plan_copies({0: [(0, 4)], 1: [(4, 8)]}, [(2, 6)])
    assert copies == [RowCopy(0, 2, 0, 2), RowCopy(1, 0, 2, 2)]
    # Adjacent rows of the same piece merge into one copy (TP1 -> TP1 is one copy per tensor).
    assert plan_copies({0: [(0, 4), (4, 8)]}, [(0, 8)]) == [RowCopy(0, 0, 0, 8)]
    # Equal blocks at constant steps (megatron's per-group q rows) become one strided copy.
    grouped = [RowCopy(0, 0, 0, 2), RowCopy(0, 4, 2, 2), RowCopy(0, 8, 4, 2), RowCopy(1, 0, 6, 2)]
    assert coalesce_strided(grouped) == [RowCopy(0, 0, 0, 2, 3, 4, 2), RowCopy(1, 0, 6, 2)]
    with pytest.raises(ValueError, match="no source"):
        plan_copies({0: [(0, 4)]}, [(3, 5)])


def test_native_target_rejects_replicated_kv_heads():
    from hybridflow.placement import ParallelDims, RoleMesh
    from megatron_adapters.bridge import WeightBridge, build_reshard_plan

    cfg, _ = tiny_llama_gqa()  # 2 kv heads
    plan = build_reshard_plan(RoleMesh("actor", (0, 1, 2, 3), ParallelDims(2, 1, 2)),
                              RoleMesh("rollout", (0, 1, 2, 3), ParallelDims(4, 1, 1)))
    with pytest.raises(ValueError, match="roles.rollout.parallel.tp"):
        WeightBridge(plan, model_shape(cfg), TargetFormat.MEGATRON)


def test_names_and_shapes_equal_those_recorded_from_vllm():
    """tests/rollout/data/vllm_param_shapes.json: what vLLM's own classes held after load_weights."""
    import json
    from pathlib import Path

    from transformers import AutoConfig

    from hybridflow.families import family_for_architecture

    recorded = json.loads((Path(__file__).parents[2] / "rollout/data/vllm_param_shapes.json").read_text())
    assert recorded["vocab_pad"] == 64
    for model in recorded["models"].values():
        fields = dict(model["hf_config"])
        arch = fields.pop("architecture")
        cfg = AutoConfig.for_model(family_for_architecture(arch).model_type, architectures=[arch], **fields)
        shape = model_shape(cfg)
        for tp, ranks in model["tp"].items():
            geometry = ShardGeometry.vllm(shape, int(tp))
            for rank, held in ranks.items():
                ours = {
                    t.name(TargetFormat.VLLM): list(t.shard_shape(shape, geometry, int(rank)))
                    for t in bridge_tensors(shape)
                }
                assert ours == held, (fields, tp, rank)


def test_checkpoint_key_prefix_ignores_optimizer_state_keys():
    from megatron_adapters.bridge.export import _key_prefix

    keys = ["optimizer.state.exp_avg.embedding.word_embeddings.weight", "embedding.word_embeddings.weight"]
    assert _key_prefix(keys, "embedding.word_embeddings.weight") == ""
