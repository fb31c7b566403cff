"""Transformer layer specs: which kernels fill a megatron-core GPT layer.

The layer's structure (pre-norm attention + gated MLP) is megatron-core's; this module only picks the
implementation, by name, from a registry:

- ``"te"``: Transformer Engine's fused spec (chosen by ``"auto"`` when ``transformer_engine`` imports).
- ``"sdpa"``: megatron-core's local spec with core attention replaced by
  :class:`~megatron_adapters.sdpa_attention.SdpaCoreAttention`, a
  small module with megatron's core-attention interface that calls PyTorch's fused
  ``scaled_dot_product_attention`` (flash / memory-efficient kernels on GPU, the math kernel on CPU).
  This is the default without Transformer Engine, and the spec the CPU tests use: it matches HF
  transformers' logits to float rounding, so no separate "plain" spec is needed on CPU. Packed sequences
  (``PackedSeqParams``, "thd") are handled there too (``megatron_adapters.sdpa_attention``).
- ``"decode"``: the ``"sdpa"`` spec with :class:`~megatron_adapters.decode_cache.KVCacheAttention`, which
  can hold a static KV cache (the native rollout engine's model; same parameters and numbers as "sdpa").
- ``"local"``: megatron-core's local spec unchanged (unfused attention; needs megatron's global memory
  buffer); kept for comparison only.

LoRA is a transform of any of these specs (``with_lora``): the targeted linears' classes become the adapted
ones of ``megatron_adapters.lora``, so the model code never asks whether adapters are on.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable

from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_adapters.decode_cache import KVCacheAttention
from megatron_adapters.lora import LoraSettings, lora_module_spec
from megatron_adapters.sdpa_attention import SdpaCoreAttention


def _te_spec(config: TransformerConfig) -> ModuleSpec:
    return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=config.qk_layernorm)


def _local_spec(config: TransformerConfig) -> ModuleSpec:
    return get_gpt_layer_local_spec(normalization=config.normalization, qk_layernorm=config.qk_layernorm)


def _with_core_attention(config: TransformerConfig, core_attention: type) -> ModuleSpec:
    spec = _local_spec(config)
    attention = spec.submodules.self_attention
    attn_subs = dataclasses.replace(attention.submodules, core_attention=core_attention)
    layer_subs = dataclasses.replace(
        spec.submodules, self_attention=dataclasses.replace(attention, submodules=attn_subs)
    )
    return dataclasses.replace(spec, submodules=layer_subs)


def _sdpa_spec(config: TransformerConfig) -> ModuleSpec:
    return _with_core_attention(config, SdpaCoreAttention)


def _decode_spec(config: TransformerConfig) -> ModuleSpec:
    return _with_core_attention(config, KVCacheAttention)


LAYER_SPECS: dict[str, Callable[[TransformerConfig], ModuleSpec]] = {
    "te": _te_spec,
    "sdpa": _sdpa_spec,
    "decode": _decode_spec,
    "local": _local_spec,
}

# Specs whose core attention reads only `cu_seqlens_q/kv` of PackedSeqParams, so the `*_padded` fields may carry
# a host copy of the offsets for megatron's RoPE (megatron_adapters.packed_rotary); not "te", whose attention
# reads them itself on the device, nor "local", whose attention has no packed path.
HOST_OFFSET_SPECS = frozenset({"sdpa", "decode"})

# Specs whose core attention keeps the a*s softmax scores for backward (megatron's unfused DotProductAttention);
# the fused kernels of the others (flash / cuDNN / memory-efficient) keep only q, k, v, the output and a
# log-sum-exp, so checkpointing them ("selective" recompute) saves nothing.
SCORE_KEEPING_SPECS = frozenset({"local"})


def transformer_engine_available() -> bool:
    """Whether Transformer Engine can be imported (decides what ``spec="auto"`` means)."""
    return importlib.util.find_spec("transformer_engine") is not None


def resolve_spec_name(spec: str) -> str:
    """Turn ``"auto"`` into a concrete spec name; reject unknown names."""
    name = ("te" if transformer_engine_available() else "sdpa") if spec == "auto" else spec
    if name not in LAYER_SPECS:
        raise ValueError(
            f"spec: unknown layer spec {spec!r}; use one of 'auto', {', '.join(map(repr, LAYER_SPECS))}"
        )
    return name


# Where each LoRA target sits in a layer spec, and which HF projections its base fuses.
LORA_SITES = {
    "linear_qkv": ("self_attention", "qkv"),
    "linear_proj": ("self_attention", None),
    "linear_fc1": ("mlp", "gate_up"),
    "linear_fc2": ("mlp", None),
}


def _submodules(entry):
    """The submodules of a spec entry: a ``ModuleSpec``, or (megatron-core 0.19's MLP) a ``partial`` of
    ``MLP.as_mlp_submodule`` that takes them as a keyword."""
    return entry.keywords["submodules"] if isinstance(entry, functools.partial) else entry.submodules


def _with_submodules(entry, submodules):
    if isinstance(entry, functools.partial):
        return functools.partial(entry.func, *entry.args, **{**entry.keywords, "submodules": submodules})
    return dataclasses.replace(entry, submodules=submodules)


def with_lora(spec: ModuleSpec, config: TransformerConfig, lora: LoraSettings) -> ModuleSpec:
    """``spec`` with ``lora.target_modules`` swapped for their adapter-carrying classes."""
    layer_subs = spec.submodules
    for block in ("self_attention", "mlp"):
        block_spec = getattr(layer_subs, block)
        subs = _submodules(block_spec)
        changes = {}
        for target in lora.target_modules:
            site, fused = LORA_SITES[target]
            if site == block:
                fused = fused if fused != "gate_up" or config.gated_linear_unit else None
                changes[target] = lora_module_spec(getattr(subs, target), lora, fused)
        new_block = _with_submodules(block_spec, dataclasses.replace(subs, **changes))
        layer_subs = dataclasses.replace(layer_subs, **{block: new_block})
    return dataclasses.replace(spec, submodules=layer_subs)


def layer_spec(config: TransformerConfig, spec: str = "auto", lora: LoraSettings | None = None) -> ModuleSpec:
    """The GPT layer spec named by ``spec`` ("auto" | "te" | "sdpa" | "local") for ``config``, with LoRA
    adapters on ``lora.target_modules`` when ``lora`` is given."""
    base = LAYER_SPECS[resolve_spec_name(spec)](config)
    return base if lora is None else with_lora(base, config, lora)
