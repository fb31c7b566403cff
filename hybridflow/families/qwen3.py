"""Qwen3 (dense): the Llama layer plus a per-head RMSNorm on queries and keys (before RoPE), and an explicit
`head_dim` that need not be hidden_size / num_attention_heads (Qwen3-0.6B: 1024 / 16 heads, head_dim 128).

megatron-core holds the norms as `self_attention.q_layernorm` / `k_layernorm` (`qk_layernorm=True`, one
`[head_dim]` weight shared by all heads, replicated over TP; megatron's finalize_model_grads sums their
gradients over TP); vLLM's Qwen3 model keeps HF's `self_attn.q_norm` / `k_norm` names and shapes, whole on
every TP rank.
"""

from __future__ import annotations

from hybridflow.families.layout import Layout, WeightMapping
from hybridflow.families.record import ModelFamily, register_family
from hybridflow.families.shape import ModelShape
from hybridflow.families.weights import decoder_layer_weights, layer_prefixes


def qwen3_layer_weights(shape: ModelShape, i: int) -> list[WeightMapping]:
    """The Llama rows and the two `[head_dim]` q/k norms (after the qkv row, as HF orders them)."""
    rows = decoder_layer_weights(shape, i)
    m, h = layer_prefixes(i)
    norms = [WeightMapping(f"{m}self_attention.{p}_layernorm.weight", (f"{h}self_attn.{p}_norm.weight",),
                           Layout.REPLICATED, (shape.head_dim,), i) for p in "qk"]
    return [*rows[:2], *norms, *rows[2:]]


QWEN3 = register_family(ModelFamily(
    model_type="qwen3",
    causal_lm="Qwen3ForCausalLM",
    sequence_classification="Qwen3ForSequenceClassification",
    layer_weights=qwen3_layer_weights,
    qk_norm=True,
    gguf_architecture="qwen3",
))
