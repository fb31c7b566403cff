"""SdpaCoreAttention on packed ("thd") input equals attending each sequence on its own (causal, GQA, and a
sliding window), on CPU through the block-diagonal mask and on GPU through torch's varlen flash kernel."""

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_adapters.forward_backward import packed_seq_params
from megatron_adapters.sdpa_attention import SdpaCoreAttention

LENGTHS = (5, 1, 8, 3)


def _attention(window: int | None) -> SdpaCoreAttention:
    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                               kv_channels=8, window_size=(window, 0) if window is not None else None)
    return SdpaCoreAttention(config, 1, AttnMaskType.causal, "self").eval()


def _check(window: int | None, device: str, dtype: torch.dtype, atol: float) -> None:
    attn = _attention(window)
    gen = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    q = torch.randn(total, 4, 8, generator=gen).to(device, dtype)
    k, v = (torch.randn(total, 2, 8, generator=gen).to(device, dtype) for _ in range(2))
    cu = torch.tensor([0, *LENGTHS], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    packed = attn(q, k, v, None, packed_seq_params=packed_seq_params(cu))
    assert packed.shape == (total, 4 * 8)
    start = 0
    for n in LENGTHS:
        # one sequence, megatron's [s, b=1, h, d] layout: the unpacked path (plain causal + window)
        alone = attn(*(t[start:start + n].unsqueeze(1) for t in (q, k, v)), None)
        torch.testing.assert_close(packed[start:start + n].float(), alone[:, 0].float(), atol=atol, rtol=0)
        start += n


@pytest.mark.parametrize("window", [None, 2])
def test_packed_attention_equals_per_sequence_cpu(window):
    _check(window, "cpu", torch.float32, 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch varlen_attn)")
@pytest.mark.parametrize("window", [None, 2])
def test_packed_attention_equals_per_sequence_varlen_gpu(window):
    _check(window, "cuda", torch.bfloat16, 2e-2)
