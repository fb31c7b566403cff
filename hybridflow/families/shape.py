"""The parallelism-independent shape of a checkpoint, and the one rule for each shape fact.

`shape_from_hf` reads an HF config (a `PretrainedConfig` or a config.json dict) exactly as the runtime
builds the model, so the planner (which reads config.json) and megatron_adapters (which reads the
`PretrainedConfig`) cannot disagree: in particular `head_dim` is the checkpoint's `head_dim` key when it
has one, else hidden_size / num_attention_heads (`resolved_head_dim`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybridflow.families.record import ModelFamily, ModelShape, family, family_for_architecture

__all__ = ["HF_CONFIG_FILE", "VOCAB_DIVISIBLE_BY", "ModelShape", "family_of_hf", "padded_vocab_size",
           "read_hf_config", "resolved_head_dim", "shape_from_hf"]

# megatron's make_vocab_size_divisible_by: the embedding and LM head hold the vocabulary padded to a multiple
# of this times TP (the planner sizes them so; megatron_adapters.model builds them so).
VOCAB_DIVISIBLE_BY = 128


def padded_vocab_size(vocab_size: int, tp: int, make_vocab_size_divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """megatron's rule: `vocab_size` rounded up to a multiple of `make_vocab_size_divisible_by * tp`."""
    multiple = make_vocab_size_divisible_by * tp
    return -(-vocab_size // multiple) * multiple

HF_CONFIG_FILE = "config.json"


def read_hf_config(checkpoint: str | Path) -> dict[str, Any]:
    """The `config.json` of HF checkpoint directory `checkpoint`, as a dict: the project's one reader of the file
    (FileNotFoundError when there is none; callers name their own field in the error)."""
    return json.loads((Path(checkpoint) / HF_CONFIG_FILE).read_text())


def resolved_head_dim(hidden_size: int, num_attention_heads: int, head_dim: int | None = None) -> int:
    """The per-head width: the checkpoint's `head_dim` when set, else hidden_size // num_attention_heads."""
    return head_dim or hidden_size // num_attention_heads


def _getter(hf: Any):
    if isinstance(hf, Mapping):
        return lambda key, default=None: hf.get(key, default)
    return lambda key, default=None: getattr(hf, key, default)


def family_of_hf(hf: Any) -> ModelFamily:
    """The family of an HF config: by `architectures[0]`, else by `model_type`."""
    get = _getter(hf)
    archs = get("architectures") or []
    return family_for_architecture(archs[0]) if archs else family(get("model_type"))


def shape_from_hf(hf: Any) -> ModelShape:
    """The shape of an HF config (`PretrainedConfig` or config.json dict); ValueError `<key>: ...; <fix>` for
    what no family here builds."""
    get = _getter(hf)
    record = family_of_hf(hf)
    if get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act: {get('hidden_act')!r} is not supported; only 'silu' (SwiGLU) models are")
    if get("mlp_bias", False):
        raise ValueError("mlp_bias: MLP biases are not supported; use a model with mlp_bias=false")
    if not record.qkv_bias and get("attention_bias", False):
        raise ValueError(f"attention_bias: {record.causal_lm} with attention biases (o_proj too) is not "
                         "supported; use attention_bias=false")
    heads = get("num_attention_heads")
    return ModelShape(
        family=record.model_type,
        hidden_size=get("hidden_size"),
        num_layers=get("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads") or heads,
        head_dim=resolved_head_dim(get("hidden_size"), heads, get("head_dim")),
        ffn_hidden_size=get("intermediate_size"),
        vocab_size=get("vocab_size"),
        tie_word_embeddings=bool(get("tie_word_embeddings", False)),
    )
