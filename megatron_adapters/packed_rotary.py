"""Rotary embeddings of packed ("thd") sequences in one pass: no per-sequence loop, no host syncs.

megatron-core 0.19's unfused thd RoPE (`rope_utils._apply_rotary_pos_emb_thd`) gets from GPTModel a table of
`max_seqlen` positions and applies it one packed sequence at a time: about a dozen small kernels per sequence,
for the query and the key of every layer, after `.tolist()` and `.item()` on `cu_seqlens` (host syncs when the
offsets live on the GPU, four per layer). The same function has a second mode, for a table with one row per
packed token (`freqs.size(0) == cu_seqlens[-1]`): one RoPE over the whole `[t, h, d]` tensor, its loop over
sequences reduced to slicing that table (consecutive slices: without context parallelism they concatenate
back to the table, one copy).

This module puts megatron in that mode. `per_token_rotary` gathers the table at each token's position inside
its own sequence (`position_ids`, restarting at 0 per sequence; see hybridflow.data.packing), so the numbers are
those of the per-sequence loop. `with_host_offsets` hands megatron's RoPE a host copy of the offsets: its
attention reads PackedSeqParams' `cu_seqlens_*_padded` first for RoPE, and those equal the offsets when no
padding lies between sequences (ours: the padding segment is a sequence of its own). Its `.item()` calls then
read host memory instead of draining the GPU queue.

Only for layer specs whose core attention reads `cu_seqlens_q/kv` alone (`specs.HOST_OFFSET_SPECS`):
Transformer Engine's attention reads the `*_padded` fields itself and has its own fused thd RoPE.
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core.packed_seq_params import PackedSeqParams


def is_thd(params: PackedSeqParams | None) -> bool:
    """Whether `params` describe packed sequences in megatron's "thd" layout."""
    return params is not None and params.qkv_format == "thd"


def per_token_rotary(table: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The `[max_seqlen, 1, 1, d]` rotary table as `[t, 1, 1, d]`: row i at packed token i's position.

    `position_ids` is the packed micro-batch's `[1, t]` position of each token inside its sequence."""
    return table[position_ids[0]]


def with_host_offsets(params: PackedSeqParams) -> PackedSeqParams:
    """`params` with a host copy of the offsets in the `*_padded` fields (read by megatron's RoPE only,
    see the module docstring). One device-to-host copy per forward, instead of syncs in every layer."""
    if params.cu_seqlens_q_padded is not None or params.cu_seqlens_kv_padded is not None:
        raise ValueError("packed_seq_params: padding between packed sequences is not supported; "
                         "pack each sequence's padding as its own segment")
    # A copy even on the CPU backend: the fields then never alias the offsets the attention kernel reads.
    host_q = params.cu_seqlens_q.to("cpu", copy=True)
    host_kv = host_q if params.cu_seqlens_kv is params.cu_seqlens_q else params.cu_seqlens_kv.to("cpu", copy=True)
    return dataclasses.replace(params, cu_seqlens_q_padded=host_q, cu_seqlens_kv_padded=host_kv)
