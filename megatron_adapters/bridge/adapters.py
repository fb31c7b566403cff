"""The LoRA adapter tensors as bridge tensors, so an adapter-only sync runs on the bridge's own plan and schedule.

A rollout engine built with the actor's adapters (same ``LoraSettings``, any TP) holds the frozen base once and
then needs only ``lora_a`` / ``lora_b.<part>`` after each update: megabytes instead of the model. Their TP
layouts (``megatron_adapters.lora``) are bridge layouts:

- column-parallel base (``linear_qkv``, ``linear_fc1``): ``lora_a`` ``[parts * rank, in]`` is ``REPLICATED``;
  each ``lora_b.<part>`` ``[part rows, rank]`` is split evenly along its rows (``COLUMN``);
- row-parallel base (``linear_proj``, ``linear_fc2``): ``lora_a`` ``[rank, in]`` is split along its input
  columns (``ROW``); ``lora_b.0`` ``[out, rank]`` is ``REPLICATED``.

The table is built from the model shape and the settings alone (every rank builds the same bridge, including
ranks with no model), next to the base entries of the one weight table it adapts.
"""

from __future__ import annotations

import torch

from megatron_adapters.bridge.vllm_layout import BridgeTensor
from megatron_adapters.hf_safetensors import stage_layer_offset
from megatron_adapters.hf_weights import Layout, WeightMapping, local_name, weight_table
from megatron_adapters.lora import LoraSettings, is_adapter_param
from megatron_adapters.model import ModelShape
from megatron_adapters.specs import LORA_SITES

_PEFT = "base_model.model."


def _part_rows(entry: WeightMapping, shape: ModelShape) -> list[int]:
    """Output rows of each HF projection a base entry fuses (q|k|v, gate|up, or the one)."""
    if entry.layout is Layout.QKV:
        kv = shape.num_kv_heads * shape.head_dim
        return [shape.num_heads * shape.head_dim, kv, kv]
    if entry.layout is Layout.GATE_UP:
        return [shape.ffn_hidden_size] * len(entry.hf)
    return [entry.full_shape[0]]


def _peft(hf_weight: str, which: str) -> str:
    return f"{_PEFT}{hf_weight.removesuffix('.weight')}.{which}.weight"


def adapter_entries(shape: ModelShape, lora: LoraSettings) -> list[WeightMapping]:
    """Every adapter tensor of the whole model (all layers), layer by layer, as ``WeightMapping`` rows whose
    ``hf`` are the PEFT names they hold (``lora_a`` of a fused base stacks its parts' ``lora_A``)."""
    base = {e.mcore: e for e in weight_table(shape, "lm")}
    rank, out = lora.rank, []
    for layer in range(shape.num_layers):
        for target in lora.target_modules:
            block, _ = LORA_SITES[target]
            prefix = f"decoder.layers.{layer}.{block}.{target}"
            entry = base[f"{prefix}.weight"]
            rows = _part_rows(entry, shape)
            row_parallel = entry.layout is Layout.ROW
            a_layout = Layout.ROW if row_parallel else Layout.REPLICATED
            a_names = tuple(_peft(h, "lora_A") for h in entry.hf)
            out.append(WeightMapping(f"{prefix}.lora_a", a_names, a_layout,
                                     (len(rows) * rank, entry.full_shape[1]), layer))
            b_layout = Layout.REPLICATED if row_parallel else Layout.COLUMN
            for part, (hf, n) in enumerate(zip(entry.hf, rows, strict=True)):
                out.append(WeightMapping(f"{prefix}.lora_b.{part}", (_peft(hf, "lora_B"),), b_layout, (n, rank),
                                         layer))
    return out


def adapter_tensors(shape: ModelShape, lora: LoraSettings) -> list[BridgeTensor]:
    """The bridge tensors of an adapter-only sync (``WeightBridge(..., tensors=...)``)."""
    return [BridgeTensor(entry) for entry in adapter_entries(shape, lora)]


def adapter_shards(model) -> dict[str, torch.Tensor]:
    """This rank's adapter weights keyed by their global-layer megatron name: the adapter bridge's input.

    Raises ValueError when the model's adapters and the table disagree (another rank or target set)."""
    params = {name: p for name, p in model.named_parameters() if is_adapter_param(p)}
    offset, count = stage_layer_offset(model), len(model.decoder.layers)
    out = {}
    for entry in adapter_entries(model.hf_shape, model.lora):
        if offset <= entry.layer < offset + count:
            name = local_name(entry, offset)
            if name not in params:
                raise ValueError(f"lora: the model has no adapter {name!r}; was it built with these settings?")
            out[entry.mcore] = params.pop(name).detach()
    if params:
        raise ValueError(f"lora: adapters {sorted(params)} are not in the adapter table")
    return out
