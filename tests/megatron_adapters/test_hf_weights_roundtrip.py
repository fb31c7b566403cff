"""HF -> megatron (TP2 x PP2) -> HF is bit-exact, for a single-file and a sharded-index checkpoint (Llama,
Qwen2, and Qwen3 with its per-head q/k norms and head_dim != hidden / heads)."""

import json

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import hf_logits, save_tiny_model, token_batch


def _roundtrip_rank(cases):
    from megatron_adapters.hf_safetensors import load_hf_weights, save_hf_weights
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    for src, dst in cases:
        model = build_gpt(src, build_role_groups(list(range(dist.get_world_size())), tp=2, pp=2, dp=1))
        load_hf_weights(model, src)
        save_hf_weights(model, dst, src)
    dist.barrier()


def _all_tensors(path):
    index = path / "model.safetensors.index.json"
    files = (
        set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    )
    tensors = {}
    for name in files:
        tensors.update(load_file(path / name))
    return tensors


def test_roundtrip_is_bit_exact(tmp_path):
    from transformers import AutoModelForCausalLM

    models = {
        "llama": save_tiny_model("llama", tmp_path / "llama", seed=5),  # single model.safetensors
        "qwen2": save_tiny_model("qwen2", tmp_path / "qwen2", seed=6),
        "qwen3": save_tiny_model("qwen3", tmp_path / "qwen3", seed=7),  # q/k norms, head_dim 16 != 64 / 8
    }
    models["qwen2"].save_pretrained(tmp_path / "qwen2", max_shard_size="40KB")  # sharded index
    assert (tmp_path / "qwen2" / "model.safetensors.index.json").exists()
    cases = [(str(tmp_path / k), str(tmp_path / f"{k}_out")) for k in models]
    run_distributed(_roundtrip_rank, 4, args=(cases,))
    for kind, model in models.items():
        original, exported = _all_tensors(tmp_path / kind), _all_tensors(tmp_path / f"{kind}_out")
        assert set(exported) == set(original)
        for name, tensor in original.items():
            assert exported[name].dtype == tensor.dtype and torch.equal(exported[name], tensor), (
                f"{kind} {name}"
            )
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / f"{kind}_out").eval()
        ids = token_batch(model.config.vocab_size)
        assert torch.equal(hf_logits(reloaded, ids), hf_logits(model, ids))
