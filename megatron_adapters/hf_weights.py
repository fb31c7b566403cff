"""The HF <-> megatron layout transforms over the one name table (``hybridflow.families.weight_table``).

The table (``WeightMapping`` rows, ``Layout`` kinds) belongs to the model families (``hybridflow.families``:
each family's record contributes its layer rows); this module re-exports it for megatron_adapters and adds
what touches tensors: building one TP rank's shard from HF slices, and inverting the layout for export.
Transformer Engine's spelling of the fused pre-norm names is here too (``te_alias``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridflow.families import Layout, ModelShape, WeightMapping, local_name, weight_table

__all__ = [
    "Layout", "ShardSpec", "SliceReader", "TE_NAME_ALIASES", "WeightMapping", "hf_to_mcore_shard", "local_name",
    "mcore_full_to_hf", "te_alias", "weight_table",
]

# Transformer Engine fuses the pre-norms into the following linear; same tensors, other names.
TE_NAME_ALIASES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}


def te_alias(name: str) -> str:
    """The Transformer Engine spelling of a local-spec parameter name (same name if none)."""
    for local, fused in TE_NAME_ALIASES.items():
        if name.endswith(local):
            return name[: -len(local)] + fused
    return name


# ---- layout transforms -------------------------------------------------------------------------------
# A reader returns HF tensor `name` restricted to rows/cols [start, stop) along `dim` (None: whole tensor),
# so each rank reads only what it owns (safetensors `get_slice`).
SliceReader = Callable[[str, int | None, int, int], torch.Tensor]


@dataclass(frozen=True)
class ShardSpec:
    """Where this rank's shard sits: TP rank/size and padded vocab size (VOCAB layout only)."""

    tp: int
    tp_rank: int
    padded_vocab: int


def _qkv_shard(entry: WeightMapping, read: SliceReader, shape: ModelShape, spec: ShardSpec) -> torch.Tensor:
    d, groups = shape.head_dim, shape.num_kv_heads // spec.tp
    q_per_group = shape.num_heads // shape.num_kv_heads
    g0 = spec.tp_rank * groups
    q = read(entry.hf[0], 0, g0 * q_per_group * d, (g0 + groups) * q_per_group * d)
    k = read(entry.hf[1], 0, g0 * d, (g0 + groups) * d)
    v = read(entry.hf[2], 0, g0 * d, (g0 + groups) * d)
    tail = q.shape[1:]
    parts = (
        q.reshape(groups, q_per_group * d, *tail),
        k.reshape(groups, d, *tail),
        v.reshape(groups, d, *tail),
    )
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def _vocab_shard(entry: WeightMapping, read: SliceReader, shape: ModelShape, spec: ShardSpec) -> torch.Tensor:
    rows = spec.padded_vocab // spec.tp
    start = spec.tp_rank * rows
    stop = min(start + rows, shape.vocab_size)
    part = read(entry.hf[0], 0, start, stop) if stop > start else None
    out = torch.zeros(rows, shape.hidden_size, dtype=part.dtype if part is not None else torch.float32)
    if part is not None:
        out[: stop - start] = part
    return out


def _split_range(size: int, spec: ShardSpec) -> tuple[int, int]:
    chunk = size // spec.tp
    return spec.tp_rank * chunk, (spec.tp_rank + 1) * chunk


def hf_to_mcore_shard(
    entry: WeightMapping, read: SliceReader, shape: ModelShape, spec: ShardSpec
) -> torch.Tensor:
    """Build this TP rank's megatron tensor for ``entry`` from the HF slices it owns."""
    if entry.layout is Layout.REPLICATED:
        return read(entry.hf[0], None, 0, 0)
    if entry.layout is Layout.QKV:
        return _qkv_shard(entry, read, shape, spec)
    if entry.layout is Layout.VOCAB:
        return _vocab_shard(entry, read, shape, spec)
    if entry.layout is Layout.ROW:
        start, stop = _split_range(entry.full_shape[1], spec)
        return read(entry.hf[0], 1, start, stop)
    if entry.layout is Layout.COLUMN:
        start, stop = _split_range(entry.full_shape[0], spec)
        return read(entry.hf[0], 0, start, stop)
    start, stop = _split_range(shape.ffn_hidden_size, spec)  # GATE_UP
    return torch.cat([read(name, 0, start, stop) for name in entry.hf], dim=0)


def mcore_full_to_hf(
    entry: WeightMapping, full: torch.Tensor, shape: ModelShape, tp: int
) -> dict[str, torch.Tensor]:
    """Invert the layout: ``full`` is the concatenation of all TP shards along ``entry.tp_dim``."""
    if entry.layout in (Layout.REPLICATED, Layout.ROW, Layout.COLUMN):
        return {entry.hf[0]: full}
    if entry.layout is Layout.VOCAB:
        return {entry.hf[0]: full[: shape.vocab_size]}
    if entry.layout is Layout.QKV:
        d, q_per_group = shape.head_dim, shape.num_heads // shape.num_kv_heads
        grouped = full.reshape(shape.num_kv_heads, (q_per_group + 2) * d, *full.shape[1:])
        q, k, v = grouped.split([q_per_group * d, d, d], dim=1)
        return {name: t.reshape(-1, *full.shape[1:]) for name, t in zip(entry.hf, (q, k, v), strict=True)}
    per_rank = full.reshape(tp, 2, shape.ffn_hidden_size // tp, *full.shape[1:])  # GATE_UP
    gate, up = (per_rank[:, j].reshape(shape.ffn_hidden_size, *full.shape[1:]) for j in range(2))
    return {entry.hf[0]: gate, entry.hf[1]: up}
