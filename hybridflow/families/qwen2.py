"""Qwen2 / Qwen2.5: the Llama layer plus q, k, v biases (always on; its config has no switch)."""

from __future__ import annotations

from hybridflow.families.layout import Layout, WeightMapping
from hybridflow.families.record import ModelFamily, register_family
from hybridflow.families.shape import ModelShape
from hybridflow.families.weights import decoder_layer_weights, layer_prefixes


def qwen2_layer_weights(shape: ModelShape, i: int) -> list[WeightMapping]:
    """The Llama rows and `linear_qkv.bias` <- q/k/v_proj.bias (megatron's grouped QKV order, like the weight)."""
    rows = decoder_layer_weights(shape, i)
    m, h = layer_prefixes(i)
    bias_rows = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
    bias = WeightMapping(m + "self_attention.linear_qkv.bias", tuple(f"{h}self_attn.{p}_proj.bias" for p in "qkv"),
                         Layout.QKV, (bias_rows,), i)
    return [*rows[:2], bias, *rows[2:]]


QWEN2 = register_family(ModelFamily(
    model_type="qwen2",
    causal_lm="Qwen2ForCausalLM",
    sequence_classification="Qwen2ForSequenceClassification",
    layer_weights=qwen2_layer_weights,
    qkv_bias=True,
    gguf_architecture="qwen2",
))
