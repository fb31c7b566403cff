"""Core attention through PyTorch's fused ``scaled_dot_product_attention``, behind megatron's interface.

The "sdpa" layer spec's core attention (``megatron_adapters.specs``) and the base of the "decode" spec's
KV-cache attention (``megatron_adapters.decode_cache``); its own module so both import it and neither
imports the other.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig


class SdpaCoreAttention(MegatronModule):
    """Core attention (softmax(QK^T)V) through ``torch.nn.functional.scaled_dot_product_attention``.

    Same constructor and forward interface as megatron-core's ``DotProductAttention``: inputs are
    ``[s, b, heads, head_dim]`` (keys/values with the per-partition query-group count), output is
    ``[s, b, heads * head_dim]``. ``attention_mask`` follows megatron's convention (True = masked out).
    """

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
        """Attention over ``[s, b, h, d]`` tensors; returns ``[sq, b, h * d]``."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError(
                "SdpaCoreAttention supports neither packed sequences nor attention bias; use spec='te'"
            )
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
