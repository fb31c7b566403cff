"""How a megatron tensor relates to its HF tensor(s): the ``Layout`` kinds and one ``WeightMapping`` row.

Layouts (megatron tensors per TP rank ``r`` of ``tp``):
- ``REPLICATED``: same full tensor on every TP rank (norm weights, per-head q/k norms, scalar heads).
- ``ROW``: split along dim 1 (``linear_proj`` <- o_proj, ``linear_fc2`` <- down_proj).
- ``QKV``: ``linear_qkv`` (weight dim 0, or bias) grouped per query group: for each of the rank's
  ``num_kv_heads / tp`` groups ``g``: ``[q_g (heads_per_group * d rows) | k_g (d) | v_g (d)]``.
- ``GATE_UP``: ``linear_fc1`` = ``[gate_r; up_r]``: each TP shard is its slice of gate, then of up.
- ``VOCAB``: embedding / LM head rows, padded with zero rows to ``padded_vocab`` then split along dim 0.
- ``COLUMN``: split evenly along dim 0 (the LoRA ``B`` of a column-parallel base, one per HF projection).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Layout(enum.Enum):
    """How a megatron tensor is laid out relative to its HF tensor(s) (see the module docstring)."""

    REPLICATED = "replicated"
    ROW = "row"
    QKV = "qkv"
    GATE_UP = "gate_up"
    VOCAB = "vocab"
    COLUMN = "column"

    @property
    def tp_dim(self) -> int | None:
        """Dimension of the megatron tensor split across TP ranks (None = replicated)."""
        return _TP_DIM[self]


_TP_DIM = {Layout.REPLICATED: None, Layout.ROW: 1, Layout.QKV: 0, Layout.GATE_UP: 0, Layout.VOCAB: 0,
           Layout.COLUMN: 0}


@dataclass(frozen=True)
class WeightMapping:
    """One megatron parameter and the HF tensor(s) it is built from.

    ``full_shape`` is the canonical shape: TP = 1, vocabulary unpadded, fused HF tensors (q|k|v, gate|up)
    stacked along dim 0 in ``hf`` order. ``tied`` marks an LM head that shares HF
    ``model.embed_tokens.weight`` (only present as a separate megatron parameter on the last pipeline stage
    when PP > 1); export skips it.
    """

    mcore: str
    hf: tuple[str, ...]
    layout: Layout
    full_shape: tuple[int, ...]
    layer: int | None = None
    tied: bool = False

    @property
    def tp_dim(self) -> int | None:
        """Dimension of the megatron tensor split across TP ranks (None = replicated)."""
        return self.layout.tp_dim
