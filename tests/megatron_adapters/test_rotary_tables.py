"""RoPE in the SDPA core attention from tables made once (megatron_adapters.rotary_tables) against megatron's own
unfused RoPE in every layer: the same logits and gradients to the bit, with megatron's RoPE no longer called."""

import pytest
import torch
from transformers import LlamaConfig

from megatron_adapters.rotary_tables import RotaryTables, cos_and_signed_sin
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import LLAMA

LAYERS = 2
FULL_RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def _logits_and_grads(dtype: torch.dtype, tables: bool, recompute: bool) -> dict:
    import megatron.core.models.common.embeddings.rope_utils as rope_utils

    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    cfg = LlamaConfig(**{**LLAMA, "num_hidden_layers": LAYERS})  # llama3 rope scaling, GQA
    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    torch.manual_seed(0)
    model = build_gpt(cfg, groups, spec="sdpa", dtype=dtype, **(FULL_RECOMPUTE if recompute else {}))
    built_with_tables = model.rotary_tables is not None
    if not tables:  # as megatron has it: angles to every layer, rotated by its unfused RoPE
        model.rotary_tables = None
        for core in model.modules():
            if hasattr(core, "rotary_tables"):
                core.rotary_tables = None
    passes = []
    bshd = rope_utils._apply_rotary_pos_emb_bshd

    def counting(*args, **kwargs):
        passes.append(1)
        return bshd(*args, **kwargs)

    rope_utils._apply_rotary_pos_emb_bshd = counting
    try:
        grads = []
        for length in (11, 7):  # a shorter batch after a longer one reads the first rows of the same tables
            ids = torch.randint(0, cfg.vocab_size, (3, length), generator=torch.Generator().manual_seed(length))
            logits = model(ids, torch.arange(length).expand(3, length), None)
            model.zero_grad()
            logits.float().pow(2).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    finally:
        rope_utils._apply_rotary_pos_emb_bshd = bshd
    return {"logits": logits.detach(), "grads": grads, "megatron_rope_passes": len(passes),
            "built_with_tables": built_with_tables}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recompute", [False, True], ids=["no-recompute", "full-recompute"])
def test_core_attention_rope_equals_megatrons_to_the_bit(dtype, recompute):
    ours, megatrons = (run_distributed(_logits_and_grads, world_size=1, args=(dtype, tables, recompute))[0]
                       for tables in (True, False))
    assert ours["built_with_tables"]
    assert ours["megatron_rope_passes"] == 0 and megatrons["megatron_rope_passes"] > 0
    assert torch.equal(ours["logits"], megatrons["logits"])
    for ours_step, megatrons_step in zip(ours["grads"], megatrons["grads"], strict=True):
        assert len(ours_step) == len(megatrons_step) > 0
        assert all(torch.equal(a, b) for a, b in zip(ours_step, megatrons_step, strict=True))


def _tables_built(overrides: dict, spec: str) -> bool:
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    cfg = LlamaConfig(**{**LLAMA, "num_hidden_layers": LAYERS})
    model = build_gpt(cfg, build_role_groups([0], tp=1, pp=1, dp=1), spec=spec, **overrides)
    return model.rotary_tables is not None


@pytest.mark.parametrize(("overrides", "spec"), [
    ({"rotary_interleaved": True}, "sdpa"),  # not what `rotate` computes
    ({"no_rope_freq": [1, 0]}, "sdpa"),  # a NoPE layer: megatron skips RoPE there
    ({}, "local"),  # megatron's own core attention
], ids=["interleaved", "nope-layer", "local-spec"])
def test_rope_the_tables_cannot_reproduce_stays_megatrons(overrides, spec):
    assert not run_distributed(_tables_built, world_size=1, args=(overrides, spec))[0]


def test_tables_grow_and_keep_their_first_rows():
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8)
    angles = torch.outer(torch.arange(20.0), inv_freq).repeat(1, 2)[:, None, None, :]
    tables = RotaryTables(torch.bfloat16)
    with pytest.raises(RuntimeError, match="cover 0 positions"):
        tables.first(3)
    tables.cover(angles[:5])
    short = tables.first(5)
    tables.cover(angles[:3])  # shorter: the tables stay
    assert tables.first(5)[0].data_ptr() == short[0].data_ptr()
    tables.cover(angles)  # longer: made again, the rows of positions 0..4 unchanged
    for got, want in zip(tables.first(5), cos_and_signed_sin(angles[:5], torch.bfloat16), strict=True):
        assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="cover 20 positions, not 21"):
        tables.first(21)
