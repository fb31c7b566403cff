"""RoPE from cos / sin tables made once, applied by our core attention instead of in every layer by megatron.

megatron-core 0.19 without Transformer Engine rotates queries and keys with its unfused RoPE
(`rope_utils._apply_rotary_pos_emb_bshd`): in every layer, for the query and again for the key, it takes the cos
and the sin of the angle table, scales and casts both, rotates half and concatenates, about a dozen small kernels
per tensor plus their backward. At 135M those launches, not the arithmetic, are what a training pass costs.
`rotate` computes the same numbers (bit for bit) in 4 kernels from tables made once:

- `RotaryTables` holds the (cos, signed sin) of positions 0..n-1 in the model's dtype, grown when a longer
  sequence comes. Row i does not depend on n, so a recompute of an earlier micro-batch (activation checkpointing,
  a pipeline schedule) reads the same rows its forward did.
- `HFGPTModel` (megatron_adapters.model) hands megatron no angles for an unpacked micro-batch, so its RoPE is
  skipped, and `SdpaCoreAttention` rotates the query and key it receives. Packed ("thd") input keeps megatron's
  RoPE in one pass per layer (megatron_adapters.packed_rotary).
- The native rollout engine's decode cache makes its own tables with `cos_and_signed_sin` over its columns and
  rotates with the same `rotate` (megatron_adapters.decode_cache).
"""

from __future__ import annotations

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding


def rotate(t: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """megatron's unfused RoPE (non-interleaved, over the whole head dim) of `t` [s, b, heads, dim], bit for bit:
    t * cos + rotate_half(t) * sin, where rotate_half(t) * sin = [-t2 * sin1, t1 * sin2] is
    roll(t, dim / 2) * [-sin1, sin2] (a sign moved between factors is exact)."""
    return t * cos + t.roll(t.shape[-1] // 2, dims=-1) * signed_sin


def cos_and_signed_sin(angles: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotate`'s tables from megatron's fp32 angles [n, 1, 1, dim], cast as its unfused RoPE casts: after the
    fp32 cos and sin."""
    half = angles.shape[-1] // 2
    sin = angles.sin().to(dtype)
    return angles.cos().to(dtype), torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotates_like_llama(rotary: torch.nn.Module, head_dim: int) -> bool:
    """Whether `rotary` is megatron's plain RotaryEmbedding over the whole head, non-interleaved: what `rotate`
    computes. Not YaRN (a subclass that also scales cos / sin) nor partial or interleaved rotary."""
    return (type(rotary) is RotaryEmbedding and not rotary.rotary_interleaved
            and rotary.inv_freq.numel() * 2 == head_dim)


class RotaryTables:
    """(cos, signed sin) of positions 0..n-1 for `rotate`, made from megatron's own angles (so Llama 3 frequency
    scaling is included) and kept across forwards."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._cos: torch.Tensor | None = None
        self._signed_sin: torch.Tensor | None = None

    def cover(self, angles: torch.Tensor) -> None:
        """Make sure the tables reach as far as `angles` ([s, 1, 1, dim], positions 0..s-1) does."""
        if self._cos is None or self._cos.shape[0] < angles.shape[0] or self._cos.device != angles.device:
            self._cos, self._signed_sin = cos_and_signed_sin(angles, self.dtype)

    def first(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables' rows for positions 0..length-1 (views)."""
        if self._cos is None or self._cos.shape[0] < length:
            raise RuntimeError(f"rotary tables cover {0 if self._cos is None else self._cos.shape[0]} positions, "
                               f"not {length}: the model's forward covers them before its layers run")
        return self._cos[:length], self._signed_sin[:length]
