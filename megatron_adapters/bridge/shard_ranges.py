"""Which rows of a parameter each TP shard holds, in one canonical coordinate, and the copies between layouts.

Every parameter is viewed along its TP dimension (``Layout.tp_dim``; dim 0 for replicated ones) in a
*canonical* coordinate that does not depend on parallelism: the HF concatenation order.

- ``QKV``: ``[q (heads*d); k (kv_heads*d); v (kv_heads*d)]`` (``q_proj; k_proj; v_proj`` stacked).
- ``GATE_UP``: ``[gate (ffn); up (ffn)]``.
- ``ROW``: the input columns; ``COLUMN``: the output rows; ``REPLICATED``: all rows.
- ``VOCAB``: the real vocabulary rows ``[0, vocab)``; padded rows have no canonical position.

A shard of a given layout is an ordered list of canonical ranges (its local rows, in order) plus its local
length (longer than the ranges for the zero-padded vocabulary rows). Moving a parameter from one layout to
another is then a list of ``RowCopy`` (intersections of source and target ranges): the same arithmetic
serves Megatron at any TP and vLLM's fused per-rank tensors, and it writes straight into the destination
tensor (no temporary full tensor).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from megatron_adapters.hf_weights import Layout
from megatron_adapters.model import VOCAB_DIVISIBLE_BY, ModelShape, padded_vocab_size

Range = tuple[int, int]

# vLLM's VocabParallelEmbedding / ParallelLMHead pad the vocabulary to a multiple of this
# (vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE) and then split the
# padded rows evenly over TP ranks (vocab_range_from_global_vocab_size uses divide(), so TP must divide it).
VLLM_VOCAB_PADDING = 64


class TargetFormat(enum.Enum):
    """Layout family of a set of TP shards."""

    MEGATRON = "megatron"  # megatron-core's own layout (training, and the native rollout engine)
    VLLM = "vllm"  # vLLM's parameters after its loader (fused qkv_proj / gate_up_proj)


@dataclass(frozen=True)
class ShardGeometry:
    """One layout of a model: format, TP size, and its padded vocabulary."""

    format: TargetFormat
    tp: int
    padded_vocab: int

    @staticmethod
    def megatron(shape: ModelShape, tp: int, make_vocab_size_divisible_by: int = VOCAB_DIVISIBLE_BY) -> ShardGeometry:
        """Megatron layout at ``tp`` with megatron's vocab padding rule (``model.padded_vocab_size``)."""
        return ShardGeometry(
            TargetFormat.MEGATRON, tp, padded_vocab_size(shape.vocab_size, tp, make_vocab_size_divisible_by)
        )

    @staticmethod
    def vllm(shape: ModelShape, tp: int) -> ShardGeometry:
        """vLLM layout at ``tp``: vocabulary padded to a multiple of 64, then split evenly."""
        padded = -(-shape.vocab_size // VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
        if padded % tp:
            raise ValueError(
                f"roles.rollout.parallel.tp: {tp} does not divide vLLM's padded vocabulary {padded} "
                f"(vocab {shape.vocab_size} "
                f"rounded up to a multiple of {VLLM_VOCAB_PADDING}); choose a tp that divides it"
            )
        return ShardGeometry(TargetFormat.VLLM, tp, padded)


@dataclass(frozen=True)
class RowCopy:
    """Copy ``length`` rows (along the TP dim) from source piece ``piece`` at ``src`` to target ``dst``.

    With ``count > 1`` it is ``count`` such blocks, the k-th at ``src + k * src_step`` / ``dst + k * dst_step``
    (one strided copy instead of one per query group for megatron's grouped QKV).
    """

    piece: int
    src: int
    dst: int
    length: int
    count: int = 1
    src_step: int = 0
    dst_step: int = 0

    def block(self, k: int) -> RowCopy:
        """The k-th single block."""
        return RowCopy(self.piece, self.src + k * self.src_step, self.dst + k * self.dst_step, self.length)


def coalesce_strided(copies: list[RowCopy]) -> list[RowCopy]:
    """Merge runs of equal-length single copies from one piece with constant src/dst steps into one."""
    out: list[RowCopy] = []
    for c in copies:
        last = out[-1] if out else None
        if last is not None and c.count == 1 and last.piece == c.piece and last.length == c.length:
            if last.count == 1 and c.src > last.src and c.dst > last.dst:
                out[-1] = RowCopy(c.piece, last.src, last.dst, c.length, 2, c.src - last.src, c.dst - last.dst)
                continue
            end = last.block(last.count)
            if last.count > 1 and (end.src, end.dst) == (c.src, c.dst):
                out[-1] = RowCopy(c.piece, last.src, last.dst, c.length, last.count + 1, last.src_step, last.dst_step)
                continue
        out.append(c)
    return out


def _even(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise ValueError(f"tp: {tp} does not divide {what}={total}; choose a tp that divides it")
    return total // tp


def _megatron_qkv(shape: ModelShape, tp: int, rank: int) -> list[Range]:
    d, heads, groups = shape.head_dim, shape.num_heads, shape.num_kv_heads
    per = _even(groups, tp, "num_key_value_heads (megatron needs num_query_groups % tp == 0)")
    qpg = heads // groups
    ranges: list[Range] = []
    for g in range(rank * per, (rank + 1) * per):
        ranges.append((g * qpg * d, (g + 1) * qpg * d))
        ranges.append((heads * d + g * d, heads * d + (g + 1) * d))
        ranges.append(((heads + groups) * d + g * d, (heads + groups) * d + (g + 1) * d))
    return ranges


def _vllm_qkv(shape: ModelShape, tp: int, rank: int) -> list[Range]:
    d, heads, groups = shape.head_dim, shape.num_heads, shape.num_kv_heads
    q = _even(heads, tp, "num_attention_heads")
    if groups >= tp:
        per = _even(groups, tp, "num_key_value_heads")
        k0, k1 = rank * per, (rank + 1) * per
    else:
        # vLLM QKVParallelLinear: fewer kv heads than ranks -> each kv head replicated on tp/kv ranks.
        replicas = _even(tp, groups, "tp (vLLM replicates kv heads only when num_key_value_heads divides tp)")
        k0 = rank // replicas
        k1 = k0 + 1
    return [
        (rank * q * d, (rank + 1) * q * d),
        (heads * d + k0 * d, heads * d + k1 * d),
        ((heads + groups) * d + k0 * d, (heads + groups) * d + k1 * d),
    ]


def shard_ranges(
    layout: Layout, shape: ModelShape, full_rows: int, geometry: ShardGeometry, rank: int
) -> tuple[list[Range], int]:
    """(canonical ranges in local order, local length along the TP dim) of TP rank ``rank``."""
    tp = geometry.tp
    if layout is Layout.REPLICATED:
        return [(0, full_rows)], full_rows
    if layout is Layout.VOCAB:
        per = _even(geometry.padded_vocab, tp, "padded vocabulary")
        start, stop = rank * per, min((rank + 1) * per, shape.vocab_size)
        return ([(start, stop)] if stop > start else []), per
    if layout in (Layout.ROW, Layout.COLUMN):
        per = _even(full_rows, tp, "row-parallel input width" if layout is Layout.ROW else "column-parallel rows")
        return [(rank * per, (rank + 1) * per)], per
    if layout is Layout.GATE_UP:
        per = _even(shape.ffn_hidden_size, tp, "intermediate_size")
        ffn = shape.ffn_hidden_size
        return [(rank * per, (rank + 1) * per), (ffn + rank * per, ffn + (rank + 1) * per)], 2 * per
    if geometry.format is TargetFormat.MEGATRON:
        ranges = _megatron_qkv(shape, tp, rank)
    else:
        ranges = _vllm_qkv(shape, tp, rank)
    return ranges, sum(b - a for a, b in ranges)


def plan_copies(source: dict[int, list[Range]], target: list[Range]) -> list[RowCopy]:
    """Copies that fill the target ranges from source pieces ({piece: ranges in local order}).

    Each canonical row of the target comes from the first piece (lowest index) that holds it, so a row
    held by several pieces (replicated tensors) is copied once. Raises if a target row is held by none.
    """
    spans: list[tuple[int, int, int, int]] = []  # (canonical start, stop, piece, local offset of start)
    for piece in sorted(source):
        offset = 0
        for a, b in source[piece]:
            spans.append((a, b, piece, offset))
            offset += b - a
    copies: list[RowCopy] = []
    dst = 0
    for a, b in target:
        pos = a
        while pos < b:
            best = None
            for s0, s1, piece, off in spans:
                if s0 <= pos < s1 and (best is None or piece < best[2]):
                    best = (s0, s1, piece, off)
            if best is None:
                raise ValueError(f"bridge: canonical row {pos} is held by no source piece")
            s0, s1, piece, off = best
            length = min(b, s1) - pos
            copy = RowCopy(piece, off + pos - s0, dst + pos - a, length)
            last = copies[-1] if copies else None
            if (
                last
                and last.piece == piece
                and last.src + last.length == copy.src
                and last.dst + last.length == copy.dst
            ):
                copies[-1] = RowCopy(piece, last.src, last.dst, last.length + length)  # one larger copy
            else:
                copies.append(copy)
            pos += length
        dst += b - a
    return copies
