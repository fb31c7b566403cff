"""The native rollout engine against Hugging Face transformers: greedy tokens equal HF's `generate`, the
sampled tokens' log-probs equal HF's log-softmax, at TP 1 and TP 2 (gloo), with prompts of different
lengths in one batch and a stop token; attention-length buckets across the four families; the unfinished
rows moved to the front and decoded alone; the cache and decode graphs kept from one generation to the next; on
a GPU, CUDA graph decode (with its fused rotate-and-store) equal to eager, compaction and kept graphs included;
the fused rotate-and-store equal to eager to the bit."""

import pytest
import torch

from hybridflow.rollout.base import RolloutBatch, SamplingParams
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

PROMPTS = ([5, 9, 13, 2, 7], [3, 4], [11, 12, 6])
NEW = 6


def _prompt_batch(width: int, prompts=PROMPTS, device: str = "cpu") -> RolloutBatch:
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        tokens[row, : len(p)] = torch.tensor(p)
    return RolloutBatch(tokens.to(device), torch.tensor([len(p) for p in prompts], device=device))


def _native_engine(hf_dir: str, tp: int = 1, **engine_args):
    """The native engine on a "decode"-spec model holding the checkpoint's weights, at TP `tp` on ranks 0..tp-1
    (megatron_engine.MegatronRolloutEngine as the module has it when called: tests may swap its DecodeStep)."""
    import hybridflow.rollout.megatron_engine as engine_module
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.model import build_gpt, model_shape
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pgs = build_role_groups(list(range(tp)), tp=tp, pp=1, dp=1)  # pooled: a second call reuses the groups
    seed_role_rng(0, pgs)  # megatron initialises GPU weights under its model-parallel RNG tracker
    model = build_gpt(hf_dir, pgs, spec="decode")
    load_hf_weights(model, hf_dir)
    return engine_module.MegatronRolloutEngine(model, pgs.tp, model_shape(hf_dir).vocab_size, **engine_args)


def _generate(hf_dir: str, tp: int, sampling: SamplingParams, attend_bucket: int = 256):
    engine = _native_engine(hf_dir, tp, attend_bucket=attend_bucket)
    out = engine.generate(_prompt_batch(max(map(len, PROMPTS)) + NEW), sampling)
    return out.tokens, out.loss_mask, out.logprobs


def _prefill_logits(hf_dir: str):
    from megatron_adapters.decode_cache import last_position_logits
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    model = build_gpt(hf_dir, pgs, spec="decode")
    load_hf_weights(model, hf_dir)
    model.eval()
    ids = torch.tensor([PROMPTS[0], [3, 4, 6, 1, 8]])
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        full = model(ids, positions, None)
        with last_position_logits(model):
            last = model(ids, positions, None)
        after = model(ids, positions, None)
    return full, last, after


def test_prefill_computes_the_last_positions_logits_only(hf_model):
    full, last, after = run_distributed(_prefill_logits, world_size=1, args=(hf_model[0],))[0]
    assert last.shape == (2, 1, full.shape[-1])
    torch.testing.assert_close(last[:, 0], full[:, -1], atol=1e-5, rtol=0)
    assert after.shape == full.shape  # the hook is gone afterwards


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    return str(path), save_tiny_model("llama", path, seed=3)


def _hf_logprobs(hf, tokens: torch.Tensor, start: int, stop: int, temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(tokens[None, :stop]).logits[0].float() / temperature
    return torch.log_softmax(logits, -1)[start - 1 : stop - 1].gather(-1, tokens[start:stop, None])[:, 0]


def _assert_greedy_matches_hf(hf, prompts, new: int, tokens, logprobs, mask=None) -> None:
    """Each row: HF's greedy tokens for its prompt, `new` of them, with HF's log-probs (and, given `mask`, a loss
    mask on exactly those tokens)."""
    for row, prompt in enumerate(prompts):
        p = len(prompt)
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0]
        assert tokens[row, : p + new].tolist() == want.tolist()
        if mask is not None:
            assert mask[row].tolist() == [0] * p + [1] * new + [0] * (tokens.shape[1] - p - new)
        torch.testing.assert_close(logprobs[row, p : p + new], _hf_logprobs(hf, tokens[row], p, p + new),
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("tp", [1, 2])
def test_greedy_tokens_and_logprobs_match_hf(hf_model, tp):
    hf_dir, hf = hf_model
    sampling = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    tokens, mask, logprobs = run_distributed(_generate, world_size=tp, args=(hf_dir, tp, sampling))[0]
    _assert_greedy_matches_hf(hf, PROMPTS, NEW, tokens, logprobs, mask)


def test_sampling_stops_at_stop_token_and_logprobs_match_hf(hf_model):
    hf_dir, hf = hf_model
    greedy = run_distributed(_generate, world_size=1,
                             args=(hf_dir, 1, SamplingParams(max_new_tokens=NEW, temperature=0.0)))[0][0]
    stop = int(greedy[0, len(PROMPTS[0]) + 1])  # row 0's second greedy token becomes a stop token
    sampling = SamplingParams(max_new_tokens=NEW, temperature=0.0, stop_token_ids=(stop,), pad_token_id=0)
    tokens, mask, _ = run_distributed(_generate, world_size=1, args=(hf_dir, 1, sampling))[0]
    p = len(PROMPTS[0])
    assert mask[0].tolist()[: p + 3] == [0] * p + [1, 1, 0]  # the stop token is kept, nothing after it
    assert tokens[0, p + 2 :].eq(0).all()

    hot = SamplingParams(max_new_tokens=NEW, temperature=0.7, seed=5)
    tokens, mask, logprobs = run_distributed(_generate, world_size=1, args=(hf_dir, 1, hot))[0]
    for row, prompt in enumerate(PROMPTS):
        p = len(prompt)
        torch.testing.assert_close(logprobs[row, p : p + NEW],
                                   _hf_logprobs(hf, tokens[row], p, p + NEW, temperature=0.7), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "qwen3"])
def test_greedy_matches_hf_across_attention_buckets(tmp_path, kind):
    """Decode steps attend over 4-column buckets (graph shapes on GPU): bucket edges, qkv bias + tied
    embeddings (qwen2), a sliding window shorter than the rows (mistral) and q/k norms with head_dim 16 !=
    hidden / heads (qwen3, its KV cache head_dim wide) still give HF's tokens."""
    hf = save_tiny_model(kind, tmp_path, seed=4)
    sampling = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    tokens, _, logprobs = run_distributed(_generate, world_size=1, args=(str(tmp_path), 1, sampling, 4))[0]
    _assert_greedy_matches_hf(hf, PROMPTS, NEW, tokens, logprobs)


# 32 rows whose prompts are 1..32 tokens long, 2 new tokens each: rows finish one column apart, so the rows still
# decoding drop to 1/4 of the batch twice (32 -> 8 -> 2).
TAIL_PROMPTS = [[(7 * row + 3 * i) % 250 + 1 for i in range(row + 1)] for row in range(32)]
TAIL_NEW = 2


def _tail_batch(device: str = "cpu") -> RolloutBatch:
    return _prompt_batch(len(TAIL_PROMPTS[-1]) + TAIL_NEW, TAIL_PROMPTS, device)


def _compacting_generate(hf_dir: str, sampling: SamplingParams, compact_factor: int, device: str = "cpu",
                         use_graphs: bool | None = None, tp: int = 1):
    """(tokens, loss mask, log-probs, rows fed to each decode step) of the tail batch. A GPU engine checks for
    finished rows every step here, as a CPU one does, so compaction's row counts are the same on both."""
    import hybridflow.rollout.megatron_engine as engine_module

    engine_module.GPU_DONE_CHECK_EVERY = 1  # every 8 columns, the tail batch goes 32 -> 2 with no 8-row step
    rows_fed = []

    class RecordingStep(engine_module.DecodeStep):
        def __call__(self, tokens, column):
            rows_fed.append(tokens.shape[0])
            return super().__call__(tokens, column)

    engine_module.DecodeStep = RecordingStep
    engine = _native_engine(hf_dir, tp, use_graphs=use_graphs, attend_bucket=8, compact_factor=compact_factor)
    out = engine.generate(_tail_batch(device), sampling)
    return out.tokens.cpu(), out.loss_mask.cpu(), out.logprobs.cpu(), rows_fed


def test_unfinished_rows_decode_alone_and_match_hf(hf_model):
    hf_dir, hf = hf_model
    greedy = SamplingParams(max_new_tokens=TAIL_NEW, temperature=0.0)
    tokens, mask, logprobs, rows_fed = run_distributed(_compacting_generate, world_size=1,
                                                       args=(hf_dir, greedy, 4))[0]
    assert sorted(set(rows_fed), reverse=True) == [32, 8, 2]  # the batch shrank twice
    assert rows_fed == sorted(rows_fed, reverse=True)
    _assert_greedy_matches_hf(hf, TAIL_PROMPTS, TAIL_NEW, tokens, logprobs, mask)  # every row back in its place
    never = run_distributed(_compacting_generate, world_size=1, args=(hf_dir, greedy, 0))[0]
    assert set(never[3]) == {32} and torch.equal(never[0], tokens)
    for rank_out in run_distributed(_compacting_generate, world_size=2, args=(hf_dir, greedy, 4, "cpu", None, 2)):
        assert torch.equal(rank_out[0], tokens) and rank_out[3] == rows_fed  # TP 2: every rank moves the same rows

    hot = SamplingParams(max_new_tokens=TAIL_NEW, temperature=0.7, seed=5)
    tokens, mask, logprobs, _ = run_distributed(_compacting_generate, world_size=1, args=(hf_dir, hot, 4))[0]
    # the random draws are made for the whole batch in row order: moving rows changes no sample
    assert torch.equal(run_distributed(_compacting_generate, world_size=1, args=(hf_dir, hot, 0))[0][0], tokens)
    for row, prompt in enumerate(TAIL_PROMPTS):
        p = len(prompt)
        assert mask[row, p : p + TAIL_NEW].all() and mask[row].sum() == TAIL_NEW
        torch.testing.assert_close(logprobs[row, p : p + TAIL_NEW],
                                   _hf_logprobs(hf, tokens[row], p, p + TAIL_NEW, temperature=0.7), atol=1e-4, rtol=0)


def _generations(hf_dir: str, sampling: SamplingParams, device: str = "cpu", use_graphs: bool | None = None):
    """One engine generates the tail batch, then its rows reversed, then a smaller and narrower batch (as
    validation's), then (its weights moved to new storage with the same values) the reversed rows again; fresh
    engines generate the reversed rows and the small batch. Returns the six (tokens, log-probs) and how many decode
    steps (with their graphs) the first engine built before and after the weights moved."""
    import hybridflow.rollout.megatron_engine as engine_module

    built = []

    class CountingStep(engine_module.DecodeStep):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    engine_module.DecodeStep = CountingStep
    tail = _tail_batch(device)
    reversed_rows = RolloutBatch(tail.tokens.flip(0), tail.prompt_lens.flip(0))
    small = RolloutBatch(tail.tokens[:8, : 8 + TAIL_NEW], tail.prompt_lens[:8])  # rows 0..7: prompts of 1..8
    kept = _native_engine(hf_dir, use_graphs=use_graphs, attend_bucket=8)
    outs = [kept.generate(tail, sampling), kept.generate(reversed_rows, sampling), kept.generate(small, sampling)]
    steps_built = len(built)
    kept.share_weights({name: t.clone() for name, t in kept.weight_tensors().items()})
    outs.append(kept.generate(reversed_rows, sampling))
    rebuilt = len(built) - steps_built
    outs += [_native_engine(hf_dir, use_graphs=use_graphs, attend_bucket=8).generate(batch, sampling)
             for batch in (reversed_rows, small)]
    return [(o.tokens.cpu(), o.logprobs.cpu()) for o in outs], steps_built, rebuilt


def test_decode_cache_and_graphs_kept_between_generations(hf_model):
    """The second generation reuses the first one's cache (whose old keys it must not see) and decode step, and so
    does a smaller, narrower batch; new weight storage gets new ones. Every output equals a fresh engine's."""
    sampling = SamplingParams(max_new_tokens=TAIL_NEW, temperature=0.0)
    outs, steps_built, rebuilt = run_distributed(_generations, world_size=1, args=(hf_model[0], sampling))[0]
    assert (steps_built, rebuilt) == (1, 1)
    fresh_tok, fresh_lp = outs[4]
    for tok, lp in (outs[1], outs[3]):
        assert torch.equal(tok, fresh_tok)
        torch.testing.assert_close(lp, fresh_lp, atol=1e-6, rtol=0)
    assert torch.equal(outs[0][0], fresh_tok.flip(0))
    assert outs[2][0].shape == (8, 8 + TAIL_NEW) and torch.equal(outs[2][0], outs[5][0])
    torch.testing.assert_close(outs[2][1], outs[5][1], atol=1e-6, rtol=0)


def _graphs_against_eager(hf_dir: str):
    batch = _prompt_batch(max(map(len, PROMPTS)) + NEW, device="cuda")  # fp32 model: TF32 is off here
    sampling = SamplingParams(max_new_tokens=NEW, temperature=0.8, seed=11)
    outs = [_native_engine(hf_dir, use_graphs=graphs, attend_bucket=4).generate(batch, sampling)
            for graphs in (False, True)]
    return [(o.tokens.cpu(), o.logprobs.cpu()) for o in outs]


@pytest.mark.gpu
def test_cuda_graph_decode_equals_eager(hf_model):
    (eager_tok, eager_lp), (graph_tok, graph_lp) = run_distributed(_graphs_against_eager, world_size=1,
                                                                   args=(hf_model[0],), device="cuda")[0]
    assert torch.equal(graph_tok, eager_tok)
    torch.testing.assert_close(graph_lp, eager_lp, atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_kept_cuda_graphs_equal_a_fresh_engine(hf_model):
    sampling = SamplingParams(max_new_tokens=TAIL_NEW, temperature=0.8, seed=3)
    outs, steps_built, rebuilt = run_distributed(_generations, world_size=1, device="cuda",
                                                 args=(hf_model[0], sampling, "cuda", True))[0]
    assert (steps_built, rebuilt) == (1, 1)
    for kept, fresh in ((outs[1], outs[4]), (outs[3], outs[4]), (outs[2], outs[5])):
        assert torch.equal(kept[0], fresh[0])
        torch.testing.assert_close(kept[1], fresh[1], atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_cuda_graph_decode_of_fewer_rows_equals_eager(hf_model):
    """Graphs captured at 32, 8 and 2 rows (and several attention buckets) give the eager tokens."""
    sampling = SamplingParams(max_new_tokens=TAIL_NEW, temperature=0.8, seed=11)
    eager, graphs = (run_distributed(_compacting_generate, world_size=1, device="cuda",
                                     args=(hf_model[0], sampling, 4, "cuda", use))[0] for use in (False, True))
    assert sorted(set(graphs[3]), reverse=True) == [32, 8, 2] and graphs[3] == eager[3]
    assert torch.equal(graphs[0], eager[0]) and torch.equal(graphs[1], eager[1])
    torch.testing.assert_close(graphs[2], eager[2], atol=1e-5, rtol=0)


def _rotations(dtype: torch.dtype):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from megatron_adapters.decode_cache import DecodeCache, PositionedRotary
    from megatron_adapters.rotary_tables import rotate

    rope = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, rotary_base=10000, use_cpu_initialization=True)
    cache = DecodeCache(torch.tensor([5]), max_len=12, attend_len=12)
    returned = PositionedRotary(rope, cache, dtype, head_dim=16)(3)
    t = torch.randn(3, 2, 4, 16, generator=torch.Generator().manual_seed(0)).to(dtype)  # [s, b, heads, dim]
    want = _apply_rotary_pos_emb_bshd(t, rope(12)[5:8])  # columns 5, 6, 7
    refused = []
    for kw in ({"rotary_interleaved": True}, {"rotary_percent": 0.5}):
        try:
            PositionedRotary(RotaryEmbedding(**{"kv_channels": 16, "rotary_percent": 1.0, **kw}), cache, dtype, 16)
        except ValueError as err:
            refused.append(str(err))
    return returned, rotate(t, *cache.rotary), want, refused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_rotation_is_megatrons_rope_bit_for_bit(dtype):
    """`rotate` with the cos / signed-sin tables `PositionedRotary` makes once per cache equals megatron's
    unfused RoPE (which recomputes cos and sin per layer), at columns read from the device-side start; RoPE it
    does not compute (interleaved, partial) is refused."""
    returned, got, want, refused = run_distributed(_rotations, world_size=1, args=(dtype,))[0]
    assert returned is None  # megatron gets no angles: it skips its own RoPE
    assert got.dtype == dtype and torch.equal(got, want)
    assert len(refused) == 2 and all("rotates like Llama" in r for r in refused)


def _stores(dtype: torch.dtype, rows: int, device: str = "cpu"):
    """(eager, fused) outputs of `rotate_and_store` over one decode token of `rows` rows into a copy of the same
    cache (the rotated query and key, both whole buffers), and the buffers before; computed on `device`."""
    from megatron_adapters.decode_cache import fused_rotate_and_store, rotate_and_store

    gen = torch.Generator().manual_seed(rows)
    query, key, value = (torch.randn(1, rows, h, 16, generator=gen).to(dtype) for h in (4, 2, 2))
    angles = torch.randn(1, 1, 1, 16, generator=gen)
    cos, signed_sin = angles.cos().to(dtype), angles.sin().to(dtype)
    before = torch.randn(2, 5, 2, 12, 16, generator=gen).to(dtype)  # keys, values: [batch, groups, len, dim]
    inputs = [t.to(device) for t in (query, key, value, cos, signed_sin)]
    outs = []
    for store in (rotate_and_store, fused_rotate_and_store()):
        k_buf, v_buf = before.to(device, copy=True)
        q, k = store(*inputs, k_buf[:rows], v_buf[:rows], torch.tensor([7], device=device))
        outs.append(tuple(t.cpu() for t in (q, k, k_buf, v_buf)))
    return (*outs, before)


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow),  # inductor's C++ compile: ~20 s
                                    pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rotate_and_store_is_eager_bit_for_bit(dtype, device):
    """The compiled rotate-and-store a GPU decode step runs (one kernel where eager launches ~12) gives eager's
    query, key and cache to the bit, at several rows and at one row (a second compile): in bf16 because inductor
    rounds each intermediate to bf16 as eager does. It writes column 7 of the first `rows` rows only."""
    for rows in (3, 1):
        eager, fused, before = run_distributed(_stores, world_size=1, args=(dtype, rows, device), device=device)[0]
        for got, want in zip(fused, eager, strict=True):
            assert got.dtype == dtype and torch.equal(got, want)
        written = torch.zeros(5, 2, 12, 16, dtype=torch.bool)
        written[:rows, :, 7] = True
        for buf, old in zip(fused[2:], before, strict=True):
            assert torch.equal(buf[~written], old[~written]) and not (buf[written] == old[written]).any()


def _fused_generate(hf_dir: str, fuse: bool):
    out = _native_engine(hf_dir, attend_bucket=8, fuse_decode=fuse).generate(
        _tail_batch(), SamplingParams(max_new_tokens=TAIL_NEW, temperature=0.7, seed=5))
    return out.tokens, out.logprobs


@pytest.mark.slow
def test_fused_decode_generates_what_eager_decode_does(hf_model):
    """The engine with the fused rotate-and-store (its default on a GPU; forced here on the CPU) samples the same
    tokens with the same log-probs as without it, over the compacted tail batch."""
    (eager_tok, eager_lp), (fused_tok, fused_lp) = (
        run_distributed(_fused_generate, world_size=1, args=(hf_model[0], fuse))[0] for fuse in (False, True))
    assert torch.equal(fused_tok, eager_tok)
    torch.testing.assert_close(fused_lp, eager_lp, atol=1e-6, rtol=0)
