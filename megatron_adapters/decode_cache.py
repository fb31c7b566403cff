"""A static-shape KV cache for decoding with a megatron-core GPTModel, so a decode step can be a CUDA graph.

megatron-core's StaticInferenceContext slices its cache with Python-int offsets that change every step, and
its CUDA-graph decode path needs flash-attn; here every shape is fixed for the whole generation and the
column being decoded is a device tensor (`DecodeCache.start`), so one captured graph replays step after step.

- `KVCacheAttention` (layer spec "decode") is `SdpaCoreAttention` that, while a cache is attached, writes the
  fed keys/values at their columns and attends a decode token over the first `attend_len` cached columns
  (masked past the token's own column). A forward of b rows uses the cache's first b rows.
- `PositionedRotary` stands in for the model's rotary embedding while a cache is attached: it reads the cos and
  sin of the fed tokens' true columns (device-side start column) from tables made once per cache, and
  `KVCacheAttention` rotates queries and keys with them (`rotate`). megatron's unfused RoPE would recompute cos
  and sin from the angles in every layer, 12 small kernels per tensor: at decode sizes those launches, not the
  arithmetic, are the cost (a 1B decode step is ~600 kernels), and `rotate` takes 4.
- A cache made with `fused=True` (the engine's choice on a GPU) rotates and stores a decode token's query, key and
  value through one torch.compile'd function (`rotate_and_store`): one or two kernels per layer instead of ~12
  (`rotate` twice, two permuted copies, two index copies). Its numbers are eager's bit for bit: inductor is told to
  round every intermediate to the model's dtype as eager does (`emulate_precision_casts`).
- `new_decode_cache(model, batch, max_len)` makes the buffers and tables; `attach_decode_cache(model, cache)` wires
  both in for one generation and takes them out after. The cache outlives the generation, so the rollout engine
  keeps it (and the graphs captured over it) from one generation to the next.
- `last_position_logits(model)`: while active, the output layer sees only the last position, so a prefill
  does not materialize [batch, prompt, vocab] logits to use one column of them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from megatron_adapters.rotary_tables import cos_and_signed_sin, rotate, rotates_like_llama
from megatron_adapters.sdpa_attention import SdpaCoreAttention


@dataclass
class DecodeCache:
    """State shared by every layer for one generation: KV buffers `[batch, groups, max_len, head_dim]`.

    start: `[1]` long, the column of the first token fed in the next forward (a prefill starts at 0).
    attend_len: keys a one-token decode step attends over (>= start + 1); fixed per captured graph.
    """

    start: torch.Tensor
    max_len: int
    attend_len: int
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    allowed: torch.Tensor | None = None  # this decode step's key mask, built by the first layer
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None  # this forward's (cos, signed sin), see `rotate`
    positioned: PositionedRotary | None = None  # the model's rotary embedding while attached
    fused: bool = False  # a decode step rotates and stores through the compiled `rotate_and_store`

    @property
    def rows(self) -> int:
        """Batch rows the buffers hold (a generation may use fewer: the first ones)."""
        return self.keys[0].shape[0]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Move the cached keys/values of batch rows `rows` (n indices) to rows 0..n-1, in that order; the
        buffers stay where they are, so graphs captured over their first rows stay valid."""
        for buf in (*self.keys, *self.values):
            buf[: rows.numel()].copy_(buf.index_select(0, rows))


def rotate_and_store(query, key, value, cos, signed_sin, cached_k, cached_v, start):
    """Rotate `query` and `key` ([s, b, heads, dim]) and write the rotated key and `value` into the first b rows
    of the cache buffers at columns start .. start + s - 1; returns the rotated (query, key)."""
    query, key = rotate(query, cos, signed_sin), rotate(key, cos, signed_sin)
    columns = start + torch.arange(query.shape[0], device=query.device)
    cached_k[:, :, columns] = key.permute(1, 2, 0, 3)  # an index_put: inductor stores into the buffer itself
    cached_v[:, :, columns] = value.permute(1, 2, 0, 3)
    return query, key


@functools.cache
def fused_rotate_and_store():
    """`rotate_and_store` through torch.compile, made once per process (shapes dynamic: every layer and every
    decode row count share it; one row is a second compile, as torch specializes sizes of 1)."""
    return torch.compile(rotate_and_store, dynamic=True, options={"emulate_precision_casts": True})


class KVCacheAttention(SdpaCoreAttention):
    """SDPA core attention with an optional per-generation KV cache (`cache`, `layer_slot` set by
    `attach_decode_cache`). Without a cache it is `SdpaCoreAttention` exactly, so training and scoring
    through this spec are unchanged."""

    cache: DecodeCache | None = None
    layer_slot: int = -1

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        cache = self.cache
        if cache is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        sq, b, heads, dim = query.shape
        # a decode step may feed only the first b rows (the rows still decoding, see DecodeStep)
        cached_k, cached_v = cache.keys[self.layer_slot][:b], cache.values[self.layer_slot][:b]
        store = fused_rotate_and_store() if cache.fused and sq == 1 else rotate_and_store
        query, key = store(query, key, value, *cache.rotary, cached_k, cached_v, cache.start)
        if sq > 1:  # prefill: starts at column 0, so the fed keys are the whole context (causal path)
            return self._unpacked(query, key, value, None)
        # One token per row: its query heads of each KV group stand in the "sequence" slot, so one SDPA
        # call covers grouped-query attention without repeating the cache.
        groups = self.groups_per_partition
        q = query[0].reshape(b, groups, heads // groups, dim)
        k, v = cached_k[:, :, : cache.attend_len], cached_v[:, :, : cache.attend_len]
        if self.layer_slot == 0:  # every layer has the same window, so one mask serves the whole step
            key_col = torch.arange(cache.attend_len, device=query.device)
            allowed = key_col <= cache.start
            if self.window_left is not None:
                allowed &= cache.start - key_col <= self.window_left
            cache.allowed = allowed.view(1, 1, 1, -1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=cache.allowed, scale=self.softmax_scale)
        return out.reshape(1, b, heads * dim)


class PositionedRotary(torch.nn.Module):
    """Stands in for the model's rotary embedding while a cache is attached: puts the cos and signed sin of
    columns [start, start + n) on the cache for `KVCacheAttention` to rotate with, and gives megatron no angles
    (so its own RoPE is skipped)."""

    def __init__(self, rotary: torch.nn.Module, cache: DecodeCache, dtype: torch.dtype, head_dim: int):
        super().__init__()
        if not rotates_like_llama(rotary, head_dim):
            raise ValueError(f"rotary: the native rollout engine rotates like Llama (non-interleaved RoPE over "
                             f"the whole head); this model's {type(rotary).__name__} is not supported")
        self._rotary = (rotary,)  # not a submodule: it goes back in place afterwards
        self.cos, self.signed_sin = cos_and_signed_sin(rotary(cache.max_len), dtype)  # megatron's own angles
        self.cache = cache
        self.columns = torch.arange(cache.max_len, device=self.cos.device)

    def get_rotary_seq_len(self, *args, **kwargs) -> int:
        return self._rotary[0].get_rotary_seq_len(*args, **kwargs)

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None) -> None:
        rows = self.cache.start + self.columns[:max_seq_len]
        self.cache.rotary = (self.cos.index_select(0, rows), self.signed_sin.index_select(0, rows))
        return None


def _cached_layers(model: torch.nn.Module) -> list[KVCacheAttention]:
    layers = [m for m in model.modules() if isinstance(m, SdpaCoreAttention)]
    if not layers or not all(isinstance(m, KVCacheAttention) for m in layers):
        raise ValueError("spec: the rollout model needs the 'decode' layer spec (KVCacheAttention)")
    return layers


def new_decode_cache(model: torch.nn.Module, batch: int, max_len: int, fused: bool = False) -> DecodeCache:
    """A KV cache for `model` (built with spec "decode", PP 1): buffers for `batch` rows of up to `max_len`
    columns, and the rotary tables. It holds its memory until dropped, so graphs captured over it can replay
    in a later generation; `attach_decode_cache` wires it in. `fused`: decode steps rotate and store through the
    compiled `rotate_and_store` (the first step at each new row count compiles, so not inside a graph capture)."""
    layers = _cached_layers(model)
    weight = next(model.parameters())
    config = layers[0].config
    cache = DecodeCache(torch.zeros(1, dtype=torch.long, device=weight.device), max_len, max_len, fused=fused)
    cache.positioned = PositionedRotary(model.rotary_pos_emb, cache, weight.dtype, config.kv_channels)  # may refuse
    for layer in layers:
        shape = (batch, layer.groups_per_partition, max_len, config.kv_channels)
        cache.keys.append(torch.zeros(shape, dtype=weight.dtype, device=weight.device))
        cache.values.append(torch.zeros(shape, dtype=weight.dtype, device=weight.device))
    return cache


@contextlib.contextmanager
def attach_decode_cache(model: torch.nn.Module, cache: DecodeCache) -> Iterator[DecodeCache]:
    """Give every `KVCacheAttention` of `model` the cache (from `new_decode_cache(model, ...)`) and the
    positioned rotary while active; the model is as built again afterwards."""
    layers = _cached_layers(model)
    cache.start.zero_()  # a generation starts with a prefill at column 0, whatever the last one left here
    for slot, layer in enumerate(layers):
        layer.cache, layer.layer_slot = cache, slot
    rotary, model.rotary_pos_emb = model.rotary_pos_emb, cache.positioned
    try:
        yield cache
    finally:
        model.rotary_pos_emb = rotary
        for layer in layers:
            layer.cache = None


@contextlib.contextmanager
def last_position_logits(model: torch.nn.Module) -> Iterator[None]:
    """While active, `model`'s output layer computes logits for the last position only (the model returns
    [batch, 1, vocab]). A prefill needs just those: at 128 x 1024 prompt tokens and a 128k vocabulary the
    full bf16 logits are 34 GB. With sequence parallelism the layer's input is a sequence shard, so it is
    left alone."""
    layer = model.output_layer
    if getattr(layer, "sequence_parallel", False):
        yield
        return

    def last_only(_module, args, kwargs):
        return (args[0][-1:], *args[1:]), kwargs  # hidden states are [seq, batch, hidden]

    handle = layer.register_forward_pre_hook(last_only, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
