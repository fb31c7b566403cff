"""The planner reads head_dim as the runtime builds it: a Qwen3 checkpoint whose head_dim (32) is not
hidden / heads (64 / 4 = 16) gets the same parameter count and KV-cache bytes per token from the memory
estimate, the auto search's cost shape and the megatron-core model megatron_adapters builds from it."""

from __future__ import annotations

import torch.distributed as dist

from hybridflow.config import load_experiment
from hybridflow.placement.auto.from_config import model_shape as cost_shape
from hybridflow.placement.memory import kv_bytes_per_token, stage_params
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

WIDE_HEADS = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=2,
                  tie_word_embeddings=False)
MATMULS = ("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")


def _runtime_rank(path):
    from megatron_adapters.decode_cache import new_decode_cache
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    out = {}
    for tp in (1, 2):
        model = build_gpt(path, build_role_groups([0, 1], tp=tp, pp=1, dp=2 // tp), spec="decode")
        named = dict(model.named_parameters())
        matmul = sum(p.numel() for n, p in named.items() if n.startswith("decoder.") and n.endswith(MATMULS))
        cache = new_decode_cache(model, batch=3, max_len=5)
        kv = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values)) // (3 * 5)
        out[tp] = (sum(p.numel() for p in named.values()), matmul, kv, model.config.kv_channels)
    dist.barrier()
    return out


def test_planner_and_runtime_agree_on_head_dim(tmp_path):
    save_tiny_model("qwen3", tmp_path, **WIDE_HEADS)
    cfg = load_experiment("tiny_cpu", [f"model.path={tmp_path}", "model.dtype=fp32"])
    model = cfg.model
    assert (model.head_dim, model.attention_head_dim, model.q_dim) == (32, 32, 128)
    runtime = run_distributed(_runtime_rank, 2, args=(str(tmp_path),))[0]
    for tp, (params, _matmul, kv, kv_channels) in runtime.items():
        assert kv_channels == model.attention_head_dim
        assert stage_params(model, "actor", tp, 1, 0) == params, f"tp{tp}"
        assert kv_bytes_per_token(model, tp, 1, "fp32") == kv, f"tp{tp}"
    shape = cost_shape(model, "actor")
    params, matmul, kv, _ = runtime[1]
    assert shape.head_dim == 32 and shape.kv_bytes_per_token == kv
    assert shape.num_layers * shape.layer_matmul_params == matmul


def test_qwen3_0_6b_plans_with_hf_parameter_count(tmp_path):
    """conf/model/qwen3_0_6b (head_dim 128, 16 heads over hidden 1024) plans, and the planner's parameter count is
    HF transformers' own count of that model (built on the meta device)."""
    import json

    import torch
    import transformers

    from hybridflow import plan

    cfg = load_experiment("ppo_llama_1b_h200", ["model=qwen3_0_6b"])
    hf = {k: getattr(cfg.model, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                                            "tie_word_embeddings")}
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**hf))
    assert stage_params(cfg.model, "actor", 1, 1, 0) == sum(p.numel() for p in reference.parameters())
    out = tmp_path / "plan.json"
    assert plan.main(["+experiment=ppo_llama_1b_h200", "model=qwen3_0_6b", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["meshes"]["actor"]["tp"] == 1


def test_llama3_2_3b_preset_has_hf_parameter_count():
    """conf/model/llama3_2_3b (issue #29's >= 3B race shape): the planner counts Llama-3.2-3B's 3,212,749,824
    parameters, which is also HF transformers' count of that config (built on the meta device)."""
    import torch
    import transformers

    cfg = load_experiment("ppo_llama_1b_h200", ["model=llama3_2_3b"])
    hf = {k: getattr(cfg.model, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "vocab_size",
                                            "tie_word_embeddings")}
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**hf))
    assert stage_params(cfg.model, "actor", 1, 1, 0) == sum(p.numel() for p in reference.parameters()) == 3_212_749_824
