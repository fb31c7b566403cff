"""Packed ("thd") input through build_gpt's "sdpa" model: RoPE in one pass per layer over per-token positions
(megatron_adapters.packed_rotary), with numbers equal to running each sequence on its own."""

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from transformers import LlamaConfig

from megatron_adapters.packed_rotary import per_token_rotary, with_host_offsets
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import LLAMA

LENGTHS = (7, 3, 9, 1)  # the last one stands for the padding segment of a packed micro-batch
LAYERS = 2


def _packed_vs_alone() -> dict:
    import megatron.core.models.common.embeddings.rope_utils as rope_utils

    from megatron_adapters.forward_backward import packed_seq_params
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    cfg = LlamaConfig(**{**LLAMA, "num_hidden_layers": LAYERS})  # the tests' tiny Llama, two layers
    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    model = build_gpt(cfg, groups, spec="sdpa").eval()
    ids = torch.randint(0, cfg.vocab_size, (1, sum(LENGTHS)), generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, *LENGTHS], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None, :]

    rope_passes, rope_offsets = [], []
    bshd, thd = rope_utils._apply_rotary_pos_emb_bshd, rope_utils._apply_rotary_pos_emb_thd

    def counting_bshd(*args, **kwargs):
        rope_passes.append(1)
        return bshd(*args, **kwargs)

    def recording_thd(t, cu_seqlens, *args, **kwargs):
        rope_offsets.append(cu_seqlens)
        return thd(t, cu_seqlens, *args, **kwargs)

    rope_utils._apply_rotary_pos_emb_bshd, rope_utils._apply_rotary_pos_emb_thd = counting_bshd, recording_thd
    try:
        with torch.no_grad():
            packed = model(ids, positions, None, packed_seq_params=packed_seq_params(cu))
    finally:
        rope_utils._apply_rotary_pos_emb_bshd, rope_utils._apply_rotary_pos_emb_thd = bshd, thd
    with torch.no_grad():
        alone = [model(ids[:, s:e], torch.arange(e - s)[None, :], None)
                 for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
    return {"packed": packed, "alone": torch.cat(alone, dim=1), "rope_passes": len(rope_passes),
            "offsets_are_padded_copies": all(o is not cu and torch.equal(o, cu) for o in rope_offsets),
            "rope_calls": len(rope_offsets)}


def test_packed_forward_equals_each_sequence_alone_with_one_rope_pass_per_query_and_key():
    result = run_distributed(_packed_vs_alone, world_size=1, device="cpu")[0]
    torch.testing.assert_close(result["packed"], result["alone"], atol=1e-5, rtol=0)
    # megatron's per-sequence loop made one pass per sequence: 2 * LAYERS * len(LENGTHS) = 16
    assert result["rope_calls"] == result["rope_passes"] == 2 * LAYERS
    assert result["offsets_are_padded_copies"]  # RoPE read the host copy, not the attention's offsets


def test_per_token_rotary_picks_each_tokens_position_row():
    table = torch.arange(10.0).reshape(10, 1, 1, 1).expand(10, 1, 1, 4)
    rows = per_token_rotary(table, torch.tensor([[0, 1, 2, 0, 1, 0]]))
    assert rows.shape == (6, 1, 1, 4)
    assert rows[:, 0, 0, 0].tolist() == [0, 1, 2, 0, 1, 0]


def test_host_offsets_fill_the_padded_fields_and_refuse_real_padding():
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    params = with_host_offsets(PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                               max_seqlen_q=3, max_seqlen_kv=3))
    assert params.cu_seqlens_q is cu and params.cu_seqlens_q_padded is not cu
    assert params.cu_seqlens_q_padded.device.type == "cpu"
    assert torch.equal(params.cu_seqlens_q_padded, cu) and params.cu_seqlens_kv_padded is params.cu_seqlens_q_padded
    with pytest.raises(ValueError, match="padding between packed sequences"):
        with_host_offsets(params)
