"""Small random HF models and an independent (plain torch) reference for the bridge's target layouts."""

from __future__ import annotations

import torch

from megatron_adapters.model import model_shape
from tests.megatron_adapters.tiny_hf_models import tiny_model


def tiny_llama_gqa(vocab: int = 1100) -> tuple[object, dict[str, torch.Tensor]]:
    """Llama, 8 heads / 2 kv heads (GQA, kv < 4), untied, vocab not a multiple of 64 (misaligned padding)."""
    return _config_and_state(tiny_model(
        "llama", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=4, max_position_embeddings=64,
        tie_word_embeddings=False))


def tiny_qwen2_tied(vocab: int = 512, hidden: int = 32, ffn: int = 64) -> tuple[object, dict[str, torch.Tensor]]:
    """Qwen2 (qkv bias), 8 heads / 4 kv heads, tied embeddings, vocab aligned with every padding rule."""
    return _config_and_state(tiny_model(
        "qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=True))


def tiny_qwen3_wide_heads(vocab: int = 320) -> tuple[object, dict[str, torch.Tensor]]:
    """Qwen3 (per-head q/k norms), hidden 32 with 4 heads of head_dim 16 (q width 64 != hidden) over 2 kv heads,
    untied, vocab not a multiple of 128."""
    return _config_and_state(tiny_model(
        "qwen3", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        tie_word_embeddings=False))


def _config_and_state(model) -> tuple[object, dict[str, torch.Tensor]]:
    # tiny_model's weights are distinct everywhere (norms too), so a misplaced tensor cannot go unnoticed.
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return model.config, state


def hf_reader(state: dict[str, torch.Tensor]):
    """A ``hf_weights.SliceReader`` over an in-memory HF state dict."""

    def read(name, dim, start, stop):
        t = state[name]
        return t.clone() if dim is None else t.narrow(dim, start, stop - start).clone()

    return read


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def reference_vllm_shard(cfg, state: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    """vLLM's per-rank tensors computed directly from HF weights (independent of the bridge's range maths)."""
    s = model_shape(cfg)
    d, kv = s.head_dim, s.num_kv_heads
    out = {}
    for name, t in state.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name or ".mlp.up_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            k, v = state[name.replace("q_proj", "k_proj")], state[name.replace("q_proj", "v_proj")]
            q = t.chunk(tp)[rank]
            if kv >= tp:
                k, v = k.chunk(tp)[rank], v.chunk(tp)[rank]
            else:
                head = rank // (tp // kv)
                k, v = k[head * d : (head + 1) * d], v[head * d : (head + 1) * d]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat([q, k, v])
        elif ".mlp.gate_proj." in name:
            up = state[name.replace("gate_proj", "up_proj")]
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat([t.chunk(tp)[rank], up.chunk(tp)[rank]])
        elif ".o_proj." in name or ".down_proj." in name:
            out[name] = t.chunk(tp, dim=1)[rank]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            padded = -(-s.vocab_size // 64) * 64
            out[name] = _pad_rows(t, padded).chunk(tp)[rank]
        else:
            out[name] = t
    return out


def reference_native_shard(cfg, state: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Megatron-layout tensors at ``tp`` computed directly from HF weights (megatron's grouped qkv)."""
    s = model_shape(cfg)
    d, heads, kv = s.head_dim, s.num_heads, s.num_kv_heads
    qpg, groups = heads // kv, kv // tp
    out = {}
    for i in range(s.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for leaf in ("weight", "bias") if s.qkv_bias else ("weight",):
            q, k, v = (state[f"{h}self_attn.{p}_proj.{leaf}"] for p in "qkv")
            parts = []
            for g in range(rank * groups, (rank + 1) * groups):
                parts += [q[g * qpg * d : (g + 1) * qpg * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]
            out[f"{m}self_attention.linear_qkv.{leaf}"] = torch.cat(parts)
        if s.qk_norm:  # one [head_dim] weight per layer, the same on every TP rank
            out[f"{m}self_attention.q_layernorm.weight"] = state[f"{h}self_attn.q_norm.weight"]
            out[f"{m}self_attention.k_layernorm.weight"] = state[f"{h}self_attn.k_norm.weight"]
        out[f"{m}input_layernorm.weight"] = state[f"{h}input_layernorm.weight"]
        out[f"{m}pre_mlp_layernorm.weight"] = state[f"{h}post_attention_layernorm.weight"]
        out[f"{m}self_attention.linear_proj.weight"] = state[f"{h}self_attn.o_proj.weight"].chunk(tp, dim=1)[rank]
        gate, up = state[f"{h}mlp.gate_proj.weight"], state[f"{h}mlp.up_proj.weight"]
        out[f"{m}mlp.linear_fc1.weight"] = torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
        out[f"{m}mlp.linear_fc2.weight"] = state[f"{h}mlp.down_proj.weight"].chunk(tp, dim=1)[rank]
    padded = -(-s.vocab_size // (128 * tp)) * 128 * tp
    out["embedding.word_embeddings.weight"] = _pad_rows(state["model.embed_tokens.weight"], padded).chunk(tp)[rank]
    out["decoder.final_layernorm.weight"] = state["model.norm.weight"]
    if not s.tie_word_embeddings:
        out["output_layer.weight"] = _pad_rows(state["lm_head.weight"], padded).chunk(tp)[rank]
    return out
