"""SdpaCoreAttention against a hand-written softmax(QK^T / sqrt(d)) V, and spec selection by name."""

import math

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_adapters.sdpa_attention import SdpaCoreAttention
from megatron_adapters.specs import LAYER_SPECS, resolve_spec_name


def _config(window=None):
    return TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                             kv_channels=8, window_size=window, attention_dropout=0.0,
                             use_cpu_initialization=True)


def _reference(q, k, v, allowed):
    """q [sq, b, h, d], k/v [sk, b, g, d]; allowed [sq, sk] bool."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("qbhd,kbhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    out = torch.einsum("bhqk,kbhd->qbhd", probs, v)
    return out.reshape(q.shape[0], q.shape[1], -1)


@pytest.mark.parametrize("sq, sk, window", [(6, 6, None), (6, 6, (2, 0)), (1, 7, None), (3, 7, (3, 0))])
def test_causal_and_window_attention_match_formula(sq, sk, window):
    torch.manual_seed(0)
    attn = SdpaCoreAttention(_config(window), 1, AttnMaskType.causal, "self")
    q, k, v = torch.randn(sq, 2, 4, 8), torch.randn(sk, 2, 2, 8), torch.randn(sk, 2, 2, 8)
    q_pos = torch.arange(sk - sq, sk)[:, None]  # queries are the last sq positions (KV-cache decoding)
    k_pos = torch.arange(sk)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= q_pos - k_pos <= window[0]
    out = attn(q, k, v, attention_mask=None)
    assert out.shape == (sq, 2, 32)
    assert torch.allclose(out, _reference(q, k, v, allowed), atol=1e-5)


def test_explicit_mask_with_fully_masked_rows_stays_finite():
    torch.manual_seed(1)
    attn = SdpaCoreAttention(_config(), 1, AttnMaskType.causal, "self")
    q, k, v = torch.randn(5, 1, 4, 8), torch.randn(5, 1, 2, 8), torch.randn(5, 1, 2, 8)
    masked = ~torch.ones(5, 5, dtype=torch.bool).tril()  # megatron convention: True = masked out
    masked[:, :2] = True  # left padding: keys 0, 1 are pads, so query rows 0, 1 see nothing
    out = attn(q, k, v, attention_mask=masked[None, None])
    assert torch.isfinite(out).all()
    assert torch.allclose(out[2:], _reference(q, k, v, ~masked)[2:], atol=1e-5)


def test_spec_names():
    assert resolve_spec_name("auto") in LAYER_SPECS
    assert resolve_spec_name("sdpa") == "sdpa"
    spec = LAYER_SPECS["sdpa"](_config())
    assert spec.submodules.self_attention.submodules.core_attention is SdpaCoreAttention
    with pytest.raises(ValueError, match="^spec: unknown layer spec 'flash'"):
        resolve_spec_name("flash")
