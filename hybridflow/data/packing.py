"""Sequence packing: a replica's right-padded rows become micro-batches of whole samples under a token budget.

A packed micro-batch is one row of concatenated samples (megatron's "thd" layout, batch 1), so no forward
runs over padding. Its dict holds every per-token field of the rows as `[1, N]` (sample after sample), and:

  cu_seqlens    [segments + 1] int32 offsets of the segments (megatron's PackedSeqParams)
  position_ids  [1, N] position inside each sample (restarts at 0)
  segment_ids   [1, N] which packed sample a token belongs to (`rows.numel()` for the padding segment)
  rows          [n] the replica rows packed here, in order

A trailing padding segment (its own sequence: it attends only to itself) rounds N up to `pad_to` (sequence
parallelism splits N over TP); a micro-batch with no rows is that segment alone (see `empty_micro_batch`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pack_by_token_budget(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices per micro-batch, each micro-batch's lengths summing to at most `budget`.

    First-fit decreasing (longest sample first, ties by row index), so the result depends only on the
    lengths: every TP/PP rank of a replica packs the same micro-batches. Rows inside a micro-batch are
    in ascending order; micro-batches are ordered by their first row.
    """
    lengths = [int(n) for n in lengths]
    too_long = [n for n in lengths if n > budget]
    if too_long:
        raise ValueError(f"max_tokens_per_micro_batch: {budget} is below a sample of {max(too_long)} tokens; raise it")
    bins: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        slot = next((i for i, free in enumerate(room) if free >= lengths[row]), None)
        if slot is None:
            bins.append([])
            room.append(budget)
            slot = len(bins) - 1
        bins[slot].append(row)
        room[slot] -= lengths[row]
    return sorted(sorted(b) for b in bins)


def pack_rows(tensors: dict[str, torch.Tensor], seq_lens: torch.Tensor, rows: Sequence[int],
              pad_to: int = 1) -> dict[str, torch.Tensor]:
    """The packed micro-batch of `rows` (module docstring). `tensors` are `[B, T]` per-token fields (and
    `[B]` per-sample ones, which are indexed); `seq_lens[b]` is row b's true length (prompt + response)."""
    lens = [int(seq_lens[r]) for r in rows]
    used = sum(lens)
    pad = -used % pad_to if used else pad_to
    segments = lens + ([pad] if pad else [])
    out = {}
    for key, value in tensors.items():
        if value.dim() == 1:
            out[key] = value[list(rows)]
            continue
        parts = [value[r, :n] for r, n in zip(rows, lens, strict=True)]
        parts.append(value.new_zeros(pad, *value.shape[2:]))
        out[key] = torch.cat(parts).unsqueeze(0)
    out["cu_seqlens"] = torch.tensor([0, *segments], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    out["position_ids"] = torch.cat([torch.arange(n) for n in segments]).unsqueeze(0)
    out["segment_ids"] = torch.repeat_interleave(torch.arange(len(segments)), torch.tensor(segments)).unsqueeze(0)
    out["rows"] = torch.tensor(list(rows), dtype=torch.long)
    return out


def empty_micro_batch(tensors: dict[str, torch.Tensor], seq_lens: torch.Tensor,
                      pad_to: int = 1) -> dict[str, torch.Tensor]:
    """A micro-batch with no rows (a padding segment only): its loss and outputs are empty, its gradient
    zero. Replicas that pack fewer micro-batches than others run these so every replica runs as many."""
    return pack_rows(tensors, seq_lens, [], pad_to)


def is_packed(micro_batch: dict[str, torch.Tensor]) -> bool:
    """Whether a micro-batch is in the packed layout (else `[rows, T]` right-padded)."""
    return "cu_seqlens" in micro_batch


def row_layout(micro_batch: dict[str, torch.Tensor], width: int | None = None) -> tuple | None:
    """Where a packed micro-batch's tokens go as rows: (samples, real tokens, segment ids, positions, width);
    None for an unpacked one. Two host reads: take it once per micro-batch for several `as_rows`."""
    if not is_packed(micro_batch):
        return None
    n = micro_batch["rows"].numel()
    real = int(micro_batch["cu_seqlens"][n])  # the samples' tokens come first, the padding segment last
    pos, seg = micro_batch["position_ids"][0, :real], micro_batch["segment_ids"][0, :real]
    width = int(pos.max()) + 1 if width is None and real else width or 0
    return n, real, seg, pos, width


def as_rows(x: torch.Tensor, micro_batch: dict[str, torch.Tensor], width: int | None = None,
            layout: tuple | None = None) -> torch.Tensor:
    """A packed `[1, N, ...]` per-token tensor back as right-padded `[n, width, ...]` rows (zeros after each
    sample's end; the padding segment dropped). Unpacked micro-batches pass through unchanged. `layout`: the
    micro-batch's `row_layout`, when several tensors of it go back to rows."""
    layout = layout or row_layout(micro_batch, width)
    if layout is None:
        return x
    n, real, seg, pos, width = layout
    out = x.new_zeros(n, width, *x.shape[2:])
    out[seg, pos] = x[0, :real]
    return out
