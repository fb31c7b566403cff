"""Core attention through PyTorch's fused ``scaled_dot_product_attention``, behind megatron's interface.

Packed sequences (``PackedSeqParams``, "thd"): PyTorch's ``torch.nn.attention.varlen.varlen_attn`` (flash
varlen) on CUDA in fp16/bf16, else SDPA with a block-diagonal causal mask.

The "sdpa" layer spec's core attention (``megatron_adapters.specs``) and the base of the "decode" spec's
KV-cache attention (``megatron_adapters.decode_cache``); its own module so both import it and neither
imports the other.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_adapters.rotary_tables import RotaryTables, rotate

try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn

    VARLEN_ARGS = frozenset(inspect.signature(varlen_attn).parameters)
except ImportError:  # older torch: packed sequences take the masked SDPA
    varlen_attn, VARLEN_ARGS = None, frozenset()


class SdpaCoreAttention(MegatronModule):
    """Core attention (softmax(QK^T)V) through ``torch.nn.functional.scaled_dot_product_attention``.

    Same constructor and forward interface as megatron-core's ``DotProductAttention``: inputs are
    ``[s, b, heads, head_dim]`` (keys/values with the per-partition query-group count), output is
    ``[s, b, heads * head_dim]``. ``attention_mask`` follows megatron's convention (True = masked out).
    With ``rotary_tables`` set (by ``build_gpt``, whose model then gives megatron no angles for unpacked input),
    an unpacked query and key are rotated here (megatron_adapters.rotary_tables).
    """

    rotary_tables: RotaryTables | None = None

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError(
                "context_parallel_size: SdpaCoreAttention has no context parallelism; use spec='te'"
            )
        # megatron's default sharded_state_dict reads `tp_group` (no parameters here, but it is walked).
        self.tp_group = pg_collection.tp if pg_collection is not None else None
        tp_size = self.tp_group.size() if self.tp_group is not None else 1
        self.attn_mask_type = attn_mask_type
        self.heads_per_partition = config.num_attention_heads // tp_size
        self.groups_per_partition = config.num_query_groups // tp_size
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        # megatron's window_size = (left, right): a query at i sees keys in [i - left, i + right].
        self.window_left = config.window_size[0] if config.window_size is not None else None

    def _mask(self, sq: int, sk: int, device: torch.device) -> torch.Tensor | None:
        """Boolean "may attend" mask for causal (bottom-right aligned, as in KV-cache decoding) + window."""
        if self.window_left is None and sq == sk:
            return None  # plain causal: use the kernel's is_causal fast path
        q_pos = torch.arange(sk - sq, sk, device=device)[:, None]
        k_pos = torch.arange(sk, device=device)[None, :]
        allowed = k_pos <= q_pos
        if self.window_left is not None:
            allowed &= q_pos - k_pos <= self.window_left
        return allowed

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        """Attention over ``[s, b, h, d]`` tensors; returns ``[sq, b, h * d]`` (packed: ``[t, h, d]`` in,
        ``[t, h * d]`` out, megatron's "thd" convention)."""
        if attention_bias is not None:
            raise ValueError("SdpaCoreAttention has no attention bias; use spec='te'")
        if packed_seq_params is not None:
            return self._packed(query, key, value, packed_seq_params)
        if self.rotary_tables is not None:
            query = rotate(query, *self.rotary_tables.first(query.shape[0]))
            key = rotate(key, *self.rotary_tables.first(key.shape[0]))
        return self._unpacked(query, key, value, attention_mask, attn_mask_type)

    def _unpacked(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None) -> torch.Tensor:
        """Attention over rotated ``[s, b, h, d]`` query and key; ``[sq, b, h * d]`` out."""
        sq, b = query.shape[0], query.shape[1]
        sk = key.shape[0]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        mask_type = attn_mask_type or self.attn_mask_type
        is_causal = False
        mask = None
        if attention_mask is not None:
            mask = ~attention_mask
            # A query with every key masked (left padding) would give NaN, and 0 * NaN spreads through the
            # value matmul of later layers; let such rows see all keys instead (their output is unused).
            mask = mask | ~mask.any(dim=-1, keepdim=True)
        elif mask_type == AttnMaskType.causal:
            mask = self._mask(sq, sk, q.device)
            is_causal = mask is None and sq > 1
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=is_causal,
            scale=self.softmax_scale,
            enable_gqa=self.heads_per_partition != self.groups_per_partition,
        )
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads_per_partition * q.shape[-1])

    def _packed(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                params: PackedSeqParams) -> torch.Tensor:
        """Causal attention inside each packed sequence of ``[t, h, d]`` inputs (rotary already applied by
        megatron per sequence); no token sees another sequence."""
        if params.qkv_format != "thd" or self.attn_mask_type != AttnMaskType.causal:
            raise ValueError("packed_seq_params: SdpaCoreAttention packs causal self-attention in 'thd' only")
        options = self._varlen_options(query)
        if options is not None:
            if self.heads_per_partition != self.groups_per_partition and "enable_gqa" not in VARLEN_ARGS:
                repeat = self.heads_per_partition // self.groups_per_partition
                key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
            out = varlen_attn(query, key, value, params.cu_seqlens_q, params.cu_seqlens_kv, params.max_seqlen_q,
                              params.max_seqlen_kv, **options)
            return out.reshape(out.shape[0], -1)
        q, k, v = (t.permute(1, 0, 2).unsqueeze(0) for t in (query, key, value))  # [1, h, t, d]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=self._block_causal_mask(params.cu_seqlens_q, query.shape[0]),
            dropout_p=self.dropout_p if self.training else 0.0, scale=self.softmax_scale,
            enable_gqa=self.heads_per_partition != self.groups_per_partition,
        )
        return out[0].permute(1, 0, 2).reshape(query.shape[0], -1)

    def _varlen_options(self, query: torch.Tensor) -> dict | None:
        """Keyword arguments for torch's varlen kernel, or None when it cannot compute this attention.

        Its signature changed between releases (torch 2.11: no `enable_gqa`, causal by `is_causal`; later:
        `window_size`), so the arguments are chosen from the signature this torch has."""
        if not _use_varlen(query) or (self.training and self.dropout_p > 0):
            return None
        options: dict = {}
        if "window_size" in VARLEN_ARGS:
            options["window_size"] = (-1 if self.window_left is None else self.window_left, 0)
        elif "is_causal" in VARLEN_ARGS and self.window_left is None:
            options["is_causal"] = True
        else:
            return None
        if "scale" in VARLEN_ARGS:
            options["scale"] = self.softmax_scale
        elif not math.isclose(self.softmax_scale, query.shape[-1] ** -0.5):
            return None
        if "enable_gqa" in VARLEN_ARGS:
            options["enable_gqa"] = self.heads_per_partition != self.groups_per_partition
        return options

    def _block_causal_mask(self, cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
        """``[t, t]`` "may attend": same sequence, key not after the query (and inside the window)."""
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu_seqlens.device), lengths)
        position = torch.arange(total, device=cu_seqlens.device) - cu_seqlens[:-1].long()[segment]
        allowed = (segment[:, None] == segment[None, :]) & (position[None, :] <= position[:, None])
        if self.window_left is not None:
            allowed &= position[:, None] - position[None, :] <= self.window_left
        return allowed


def varlen_kernel_runs(dtype: torch.dtype, on_cuda: bool) -> bool:
    """Whether packed attention runs PyTorch's flash varlen kernel (CUDA, half precision). Elsewhere it is a
    masked SDPA, which keeps its ``[t, t]`` block mask (on the CPU its attention weights) for backward."""
    return varlen_attn is not None and on_cuda and dtype in (torch.float16, torch.bfloat16)


def _use_varlen(query: torch.Tensor) -> bool:
    return varlen_kernel_runs(query.dtype, query.is_cuda)
