"""The tensors the bridge moves, and their names and shapes in each target layout.

Built from ``megatron_adapters.hf_weights.weight_table`` (the one name table); nothing here matches module
names. Targets:

- vLLM (every registered family: Llama / Qwen2 / Qwen3 / Mistral), per TP rank, as vLLM's model holds them
  after its loader:
  ``model.embed_tokens.weight`` and ``lm_head.weight``: rows of the vocabulary padded to a multiple of 64,
  split evenly, padded rows zero; ``self_attn.qkv_proj.weight`` / ``.bias``: ``[q shard; k shard; v shard]``
  (kv heads replicated when kv heads < TP); ``o_proj`` / ``down_proj`` split on the input dim;
  ``mlp.gate_up_proj.weight`` = ``[gate shard; up shard]`` (the fused names: the family record's
  ``vllm_stacked``); norms whole (Qwen3's per-head ``q_norm`` / ``k_norm`` too). A tied LM head is not a separate
  tensor (vLLM ties ``lm_head`` to ``embed_tokens``).
- native: megatron-core's layout at the generation TP (global layer names, one pipeline stage).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_adapters.bridge.shard_ranges import (
    ShardGeometry,
    TargetFormat,
    plan_copies,
    shard_ranges,
)
from megatron_adapters.hf_weights import Layout, WeightMapping, weight_table
from megatron_adapters.model import ModelShape


@dataclass(frozen=True)
class BridgeTensor:
    """One logical parameter: its table entry and canonical full shape (TP=1, vocabulary unpadded)."""

    entry: WeightMapping
    stacked: str | None = None  # vLLM's fused module name (the family's `vllm_stacked`), None: HF's own name
    after_layers: bool = False  # a non-layer tensor after the decoder (final norm, LM head): last stage

    @property
    def full_shape(self) -> tuple[int, ...]:
        return self.entry.full_shape

    @property
    def dim(self) -> int:
        """The TP dimension (0 for replicated tensors: rows are then the whole tensor)."""
        return self.entry.tp_dim or 0

    def ranges(self, shape: ModelShape, geometry: ShardGeometry, rank: int) -> tuple[list[tuple[int, int]], int]:
        """(canonical ranges, local length) of TP rank ``rank`` in ``geometry``."""
        return shard_ranges(self.entry.layout, shape, self.full_shape[self.dim], geometry, rank)

    def shard_shape(self, shape: ModelShape, geometry: ShardGeometry, rank: int) -> tuple[int, ...]:
        """The tensor shape of TP rank ``rank`` in ``geometry``."""
        _, local = self.ranges(shape, geometry, rank)
        out = list(self.full_shape)
        out[self.dim] = local
        return tuple(out)

    def name(self, fmt: TargetFormat) -> str:
        """The parameter name in a target format."""
        if fmt is TargetFormat.MEGATRON:
            return self.entry.mcore
        if self.stacked is None:
            return self.entry.hf[0]
        module, _, leaf = self.entry.hf[0].rpartition(".")
        return f"{module.rpartition('.')[0]}.{self.stacked}.{leaf}"


def bridge_tensors(shape: ModelShape) -> list[BridgeTensor]:
    """Every tensor the rollout model holds (LM head; a tied head is the embedding), in table order."""
    out, seen_layer = [], False
    stacked = shape.record.vllm_stacked
    for entry in weight_table(shape, "lm"):
        seen_layer = seen_layer or entry.layer is not None
        if entry.tied:
            continue
        out.append(BridgeTensor(entry, stacked.get(entry.layout), after_layers=seen_layer and entry.layer is None))
    return out


def _split_canonical(t: BridgeTensor, shape: ModelShape, canonical: torch.Tensor) -> dict[str, torch.Tensor]:
    if t.entry.layout is Layout.QKV:
        d = shape.head_dim
        sizes = [shape.num_heads * d, shape.num_kv_heads * d, shape.num_kv_heads * d]
        return dict(zip(t.entry.hf, canonical.split(sizes, dim=0), strict=True))
    if t.entry.layout is Layout.GATE_UP:
        return dict(zip(t.entry.hf, canonical.split(shape.ffn_hidden_size, dim=0), strict=True))
    return {t.entry.hf[0]: canonical}


def _join_canonical(t: BridgeTensor, hf: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([hf[name] for name in t.entry.hf], dim=0) if len(t.entry.hf) > 1 else hf[t.entry.hf[0]]


def hf_from_shards(
    shards: list[dict[str, torch.Tensor]], shape: ModelShape, geometry: ShardGeometry
) -> dict[str, torch.Tensor]:
    """Rebuild the HF state dict from all TP shards of a target layout (inverse of ``shards_from_hf``)."""
    hf: dict[str, torch.Tensor] = {}
    for t in bridge_tensors(shape):
        name = t.name(geometry.format)
        first = shards[0][name]
        canonical = first.new_empty(t.full_shape)
        for rank, shard in enumerate(shards):
            if tuple(shard[name].shape) != t.shard_shape(shape, geometry, rank):
                raise ValueError(f"bridge: {name} on rank {rank} has shape {tuple(shard[name].shape)}")
            ranges, _ = t.ranges(shape, geometry, rank)
            offset = 0
            for a, b in ranges:
                canonical.narrow(t.dim, a, b - a).copy_(shard[name].narrow(t.dim, offset, b - a))
                offset += b - a
        hf.update(_split_canonical(t, shape, canonical))
    return hf


def shards_from_hf(
    hf: dict[str, torch.Tensor],
    shape: ModelShape,
    geometry: ShardGeometry,
    rank: int,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """TP rank ``rank``'s tensors in ``geometry`` from full HF tensors (used by the offline export)."""
    out = {}
    for t in bridge_tensors(shape):
        canonical = _join_canonical(t, hf)
        ranges, _ = t.ranges(shape, geometry, rank)
        dst = torch.zeros(t.shard_shape(shape, geometry, rank), dtype=dtype or canonical.dtype)
        for c in plan_copies({0: [(0, t.full_shape[t.dim])]}, ranges):
            dst.narrow(t.dim, c.dst, c.length).copy_(canonical.narrow(t.dim, c.src, c.length))
        out[t.name(geometry.format)] = dst
    return out
