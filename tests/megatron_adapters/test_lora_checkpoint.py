"""LoRA adapters through megatron dist checkpointing: saved at TP2, loaded at TP1 (x DP2), exported to PEFT's
format bit for bit equal to the adapter they started from (A is split by input columns in row-parallel layers and
B by output rows in column-parallel ones, so each must be stored by its TP dimension). The checkpoint holds the
adapters only: the frozen base is the HF checkpoint the model is built from."""

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, tiny_model

peft = pytest.importorskip("peft")

RANK, ALPHA = 4, 8.0


def _reshard_rank(root):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from megatron_adapters.checkpoint import load_checkpoint, save_checkpoint
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.lora import LoraSettings
    from megatron_adapters.model import build_gpt
    from megatron_adapters.peft_export import load_peft_adapter, save_peft_adapter
    from megatron_adapters.process_groups import build_role_groups

    ranks, lora = list(range(dist.get_world_size())), LoraSettings(rank=RANK, alpha=ALPHA)
    saved = build_gpt(root / "base", build_role_groups(ranks, tp=2, pp=1, dp=1), spec="sdpa", lora=lora)
    load_hf_weights(saved, root / "base")
    load_peft_adapter(saved, root / "adapter")
    save_checkpoint(root / "ckpt", saved, root / "base")
    loaded = build_gpt(root / "base", build_role_groups(ranks, tp=1, pp=1, dp=2), spec="sdpa", lora=lora)
    load_checkpoint(root / "ckpt", loaded)
    save_peft_adapter(loaded, root / "export")
    return sorted(dist_checkpointing.load_tensors_metadata(str(root / "ckpt")))


def test_adapters_reshard_through_dist_checkpoint(tmp_path):
    save_tiny_model("llama", tmp_path / "base", seed=1)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(tiny_model("llama", seed=1), config)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
    model.save_pretrained(tmp_path / "adapter")
    saved_keys = run_distributed(_reshard_rank, world_size=2, args=(tmp_path,))[0]
    # adapters only: the frozen base is the HF checkpoint the model is built from
    assert saved_keys and all(".lora_a" in k or ".lora_b." in k for k in saved_keys), saved_keys
    original = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    exported = load_file(tmp_path / "export" / "adapter_model.safetensors")
    assert exported.keys() == original.keys()
    for key, tensor in original.items():
        assert torch.equal(exported[key], tensor), key
