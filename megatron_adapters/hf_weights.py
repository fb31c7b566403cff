"""The one table of HF <-> megatron-core parameter names and layouts, and the layout transforms.

Every parameter of a megatron-core GPT built by ``megatron_adapters.model.build_gpt`` has one
``WeightMapping``: its megatron name (local-spec spelling, *global* layer index), the HF tensor(s) it is made
of, its ``Layout`` (which fixes the TP split dimension and the fused layouts), and the global layer.
Loading, export, dist-checkpoint conversion and the resharding bridge all read this table; nothing else
string-matches weight names.

Layouts (megatron tensors per TP rank ``r`` of ``tp``):
- ``REPLICATED``: same full tensor on every TP rank (norm weights, scalar heads).
- ``ROW``: split along dim 1 (``linear_proj`` <- o_proj, ``linear_fc2`` <- down_proj).
- ``QKV``: ``linear_qkv`` (weight dim 0, or bias) grouped per query group: for each of the rank's
  ``num_kv_heads / tp`` groups ``g``: ``[q_g (heads_per_group * d rows) | k_g (d) | v_g (d)]``.
- ``GATE_UP``: ``linear_fc1`` = ``[gate_r; up_r]``: each TP shard is its slice of gate, then of up.
- ``VOCAB``: embedding / LM head rows, padded with zero rows to ``padded_vocab`` then split along dim 0.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from megatron_adapters.model import ModelShape


class Layout(enum.Enum):
    """How a megatron tensor is laid out relative to its HF tensor(s) (see the module docstring)."""

    REPLICATED = "replicated"
    ROW = "row"
    QKV = "qkv"
    GATE_UP = "gate_up"
    VOCAB = "vocab"

    @property
    def tp_dim(self) -> int | None:
        """Dimension of the megatron tensor split across TP ranks (None = replicated)."""
        return _TP_DIM[self]


_TP_DIM = {Layout.REPLICATED: None, Layout.ROW: 1, Layout.QKV: 0, Layout.GATE_UP: 0, Layout.VOCAB: 0}


@dataclass(frozen=True)
class WeightMapping:
    """One megatron parameter and the HF tensor(s) it is built from.

    ``tied`` marks an LM head that shares HF ``model.embed_tokens.weight`` (only present as a separate
    megatron parameter on the last pipeline stage when PP > 1); export skips it.
    """

    mcore: str
    hf: tuple[str, ...]
    layout: Layout
    layer: int | None = None
    tied: bool = False

    @property
    def tp_dim(self) -> int | None:
        """Dimension of the megatron tensor split across TP ranks (None = replicated)."""
        return self.layout.tp_dim


# Transformer Engine fuses the pre-norms into the following linear; same tensors, other names.
TE_NAME_ALIASES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}


def _layer_mappings(shape: ModelShape, i: int) -> list[WeightMapping]:
    m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
    attn = [f"{h}self_attn.{p}_proj" for p in "qkv"]
    rows = [
        WeightMapping(m + "input_layernorm.weight", (h + "input_layernorm.weight",), Layout.REPLICATED, i),
        WeightMapping(
            m + "self_attention.linear_qkv.weight", tuple(a + ".weight" for a in attn), Layout.QKV, i
        ),
        WeightMapping(
            m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",), Layout.ROW, i
        ),
        WeightMapping(
            m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",), Layout.REPLICATED, i
        ),
        WeightMapping(
            m + "mlp.linear_fc1.weight",
            (h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"),
            Layout.GATE_UP,
            i,
        ),
        WeightMapping(m + "mlp.linear_fc2.weight", (h + "mlp.down_proj.weight",), Layout.ROW, i),
    ]
    if shape.qkv_bias:
        rows.insert(
            2,
            WeightMapping(
                m + "self_attention.linear_qkv.bias", tuple(a + ".bias" for a in attn), Layout.QKV, i
            ),
        )
    return rows


def weight_table(shape: ModelShape, head: str = "lm") -> list[WeightMapping]:
    """Every parameter of the whole model (all layers, all stages), in HF file order."""
    table = [WeightMapping("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), Layout.VOCAB)]
    for i in range(shape.num_layers):
        table += _layer_mappings(shape, i)
    table.append(WeightMapping("decoder.final_layernorm.weight", ("model.norm.weight",), Layout.REPLICATED))
    if head != "lm":
        table.append(WeightMapping("output_layer.weight", ("score.weight",), Layout.REPLICATED))
    elif shape.tie_word_embeddings:
        table.append(
            WeightMapping("output_layer.weight", ("model.embed_tokens.weight",), Layout.VOCAB, tied=True)
        )
    else:
        table.append(WeightMapping("output_layer.weight", ("lm_head.weight",), Layout.VOCAB))
    return table


def local_name(entry: WeightMapping, layer_offset: int) -> str:
    """The megatron name on a pipeline stage whose first layer is global layer ``layer_offset``."""
    if entry.layer is None:
        return entry.mcore
    prefix = f"decoder.layers.{entry.layer}."
    return f"decoder.layers.{entry.layer - layer_offset}." + entry.mcore[len(prefix) :]


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
        start, stop = _split_range(shape_of_row_input(entry, shape), spec)
        return read(entry.hf[0], 1, start, stop)
    start, stop = _split_range(shape.ffn_hidden_size, spec)  # GATE_UP
    return torch.cat([read(name, 0, start, stop) for name in entry.hf], dim=0)


def shape_of_row_input(entry: WeightMapping, shape: ModelShape) -> int:
    """Input width of a ROW-parallel linear (the dimension TP splits)."""
    return (
        shape.ffn_hidden_size
        if entry.mcore.endswith("linear_fc2.weight")
        else shape.num_heads * shape.head_dim
    )


def mcore_full_to_hf(
    entry: WeightMapping, full: torch.Tensor, shape: ModelShape, tp: int
) -> dict[str, torch.Tensor]:
    """Invert the layout: ``full`` is the concatenation of all TP shards along ``entry.tp_dim``."""
    if entry.layout in (Layout.REPLICATED, Layout.ROW):
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
