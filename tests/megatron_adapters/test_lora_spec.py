"""LoRA chosen through the layer spec: which classes the transform swaps, and the one-line errors of bad input."""

import json

import pytest
import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from megatron_adapters.lora import (
    LoraColumnParallelLinear,
    LoraRowParallelLinear,
    LoraSettings,
    interleave_parts,
    lora_module_spec,
)
from megatron_adapters.model import transformer_config_from_hf
from megatron_adapters.specs import layer_spec
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import LLAMA


def _targets(spec) -> dict:
    attention = spec.submodules.self_attention.submodules
    mlp = spec.submodules.mlp.keywords["submodules"]
    return {"linear_qkv": attention.linear_qkv, "linear_proj": attention.linear_proj,
            "linear_fc1": mlp.linear_fc1, "linear_fc2": mlp.linear_fc2}


def test_spec_swaps_only_the_targets():
    config = transformer_config_from_hf({"model_type": "llama", **LLAMA})
    lora = LoraSettings(rank=2, alpha=4.0, target_modules=("linear_qkv", "linear_fc2"))
    base, adapted = _targets(layer_spec(config, "sdpa")), _targets(layer_spec(config, "sdpa", lora))
    assert base == {"linear_qkv": ColumnParallelLinear, "linear_proj": RowParallelLinear,
                    "linear_fc1": ColumnParallelLinear, "linear_fc2": RowParallelLinear}
    assert adapted["linear_qkv"].module is LoraColumnParallelLinear
    assert adapted["linear_qkv"].params == {"lora": lora, "fused": "qkv"}
    assert adapted["linear_fc2"].module is LoraRowParallelLinear
    assert adapted["linear_proj"] is RowParallelLinear and adapted["linear_fc1"] is ColumnParallelLinear
    assert _targets(layer_spec(config, "sdpa", LoraSettings(2, 4.0)))["linear_fc1"].params["fused"] == "gate_up"


@pytest.mark.parametrize("fields, message", [
    (dict(rank=0, alpha=1.0), "lora.rank"),
    (dict(rank=4, alpha=1.0, dropout=1.0), "lora.dropout"),
    (dict(rank=4, alpha=1.0, target_modules=("q_proj",)), "lora.target_modules"),
])
def test_bad_settings_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        LoraSettings(**fields)


def test_unsupported_base_class_names_the_fix():
    with pytest.raises(ValueError, match="spec='sdpa'"):
        lora_module_spec(torch.nn.Linear, LoraSettings(rank=4, alpha=8.0))


def test_interleave_is_per_group():
    q, k, v = torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6]), torch.tensor([7, 8])
    assert interleave_parts([q, k, v], groups=2, dim=0).tolist() == [1, 2, 5, 7, 3, 4, 6, 8]


def _mismatch_rank(path, adapter_dir):
    import torch.distributed as dist

    from megatron_adapters.model import build_gpt
    from megatron_adapters.peft_export import load_peft_adapter
    from megatron_adapters.process_groups import build_role_groups

    pg = build_role_groups([dist.get_rank()], tp=1, pp=1, dp=1)
    model = build_gpt(path, pg, spec="sdpa", lora=LoraSettings(rank=4, alpha=8.0))
    try:
        load_peft_adapter(model, adapter_dir)
    except ValueError as error:
        return str(error)
    return None


def test_adapter_of_another_rank_is_refused(tmp_path):
    from tests.megatron_adapters.tiny_hf_models import save_tiny_model

    save_tiny_model("llama", tmp_path / "base")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8,
                                                                          "lora_alpha": 16}))
    [message] = run_distributed(_mismatch_rank, world_size=1, args=(tmp_path / "base", tmp_path / "adapter"))
    assert message is not None and "r=8" in message and "roles.<role>.lora" in message


def _bridge_and_dropout_rank(path):
    import torch.distributed as dist

    from megatron_adapters.bridge import training_shards
    from megatron_adapters.lora import adapters_merged
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pg = build_role_groups(list(range(dist.get_world_size())), tp=2, pp=1, dp=1)
    seed_role_rng(1, pg)
    model = build_gpt(path, pg, spec="sdpa", lora=LoraSettings(rank=4, alpha=8.0, dropout=0.5))
    qkv = model.decoder.layers[0].self_attention.linear_qkv
    with torch.no_grad():
        for b in qkv.lora_b:
            b.normal_()
    try:
        training_shards(model)
        refused = None
    except ValueError as error:
        refused = str(error)
    with adapters_merged(model):
        merged = training_shards(model)["decoder.layers.0.self_attention.linear_qkv.weight"].clone()
    expected = qkv.weight + qkv.delta_weight()
    ids = torch.arange(8).reshape(1, 8)
    position_ids = torch.arange(8).reshape(1, 8)
    model.train()
    dropped = model(ids, position_ids, None)
    dropped.sum().backward()  # the row-parallel dropout forks megatron's TP RNG: it must be seeded and work
    model.eval()
    return refused, (merged - expected).abs().max().item(), (dropped - model(ids, position_ids, None)).abs().max()


def test_bridge_refuses_live_adapters_and_ships_merged_weights(tmp_path):
    from tests.megatron_adapters.tiny_hf_models import save_tiny_model

    save_tiny_model("llama", tmp_path)
    for refused, merged_diff, dropout_effect in run_distributed(_bridge_and_dropout_rank, 2, args=(tmp_path,)):
        assert refused is not None and "adapters_merged" in refused
        assert merged_diff <= 1e-6
        assert dropout_effect > 0  # dropout acts in training mode only
