"""Vocab-parallel log-probs and entropy at TP2 equal a full-vocab log_softmax reference (values and grads)."""

import pytest
import torch

from tests.distributed_harness import run_distributed

VOCAB, PADDED = 11, 12  # 12 = padded to a multiple of TP=2; id 11 is padding


def _full_logits() -> torch.Tensor:
    """Random logits with the padding id at PADDED_LOGIT, as build_gpt's output hook leaves it."""
    from megatron_adapters.model import PADDED_LOGIT

    logits = torch.randn(3, 5, PADDED, generator=torch.Generator().manual_seed(0)) * 3
    logits[..., VOCAB:] = PADDED_LOGIT
    return logits


def _targets() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(1))


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return torch.randn(3, 5, generator=generator), torch.randn(3, 5, generator=generator)


def _vocab_parallel(temperature: float, chunk_tokens: int = 1024) -> dict:
    import torch.distributed as dist

    from megatron_adapters import logprobs as lp
    from megatron_adapters.cpu_backend import compute_device
    from megatron_adapters.logprobs import token_logprobs
    from megatron_adapters.process_groups import build_role_groups

    lp.CHUNK_TOKENS = chunk_tokens

    device = compute_device()  # the data comes from CPU generators (same on every device), then moves
    pgs = build_role_groups([0, 1], tp=2, pp=1, dp=1)
    local = _full_logits().chunk(2, dim=-1)[pgs.tp.rank()].clone().to(device).requires_grad_()
    targets = _targets().to(device)
    logprobs, entropy = token_logprobs(local, targets, pgs.tp, temperature=temperature, with_entropy=True)
    w_logprob, w_entropy = (w.to(device) for w in _weights())
    (logprobs * w_logprob + entropy * w_entropy).sum().backward()
    only_logprobs = token_logprobs(local.detach(), targets, pgs.tp, temperature=temperature)
    return {  # compared with the parent's CPU reference
        "rank": dist.get_rank(),
        "logprobs": logprobs.detach().cpu(),
        "entropy": entropy.detach().cpu(),
        "grad": local.grad.cpu(),
        "only_logprobs": only_logprobs.cpu(),
    }


def _reference(temperature: float):
    full = _full_logits().requires_grad_()
    log_p = torch.log_softmax(full[..., :VOCAB].double() / temperature, dim=-1)
    logprobs = log_p.gather(-1, _targets().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    w_logprob, w_entropy = _weights()
    (logprobs * w_logprob + entropy * w_entropy).sum().backward()
    return logprobs.float(), entropy.float(), full.grad


@pytest.mark.parametrize("chunk_tokens", [1024, 4])
def test_tp2_logprobs_and_entropy_match_full_vocab_reference(chunk_tokens):
    """One chunk, or chunks of one row cut in pieces (each chunk reduces over the TP group on its own)."""
    temperature = 0.7
    results = run_distributed(_vocab_parallel, world_size=2, args=(temperature, chunk_tokens))
    logprobs, entropy, grad = _reference(temperature)
    for result in results:
        torch.testing.assert_close(result["logprobs"], logprobs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result["only_logprobs"], logprobs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result["entropy"], entropy, rtol=1e-5, atol=1e-5)
    grads = torch.cat([r["grad"] for r in sorted(results, key=lambda r: r["rank"])], dim=-1)
    torch.testing.assert_close(grads, grad, rtol=1e-4, atol=1e-5)
    assert torch.all(grads[..., VOCAB:] == 0)  # padding ids get no probability and no gradient


def _one_rank(temperature: float) -> dict:
    """TP1: values and grads, plus the collectives and host reads one call makes."""
    from torch.profiler import ProfilerActivity, profile

    from megatron_adapters.logprobs import token_logprobs
    from megatron_adapters.process_groups import build_role_groups

    pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    full = _full_logits().requires_grad_()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        logprobs, entropy = token_logprobs(full, _targets(), pgs.tp, temperature=temperature, with_entropy=True)
        only_logprobs = token_logprobs(full.detach(), _targets(), pgs.tp, temperature=temperature)
    w_logprob, w_entropy = _weights()
    (logprobs * w_logprob + entropy * w_entropy).sum().backward()
    events = prof.key_averages()
    return {"logprobs": logprobs.detach(), "entropy": entropy.detach(), "grad": full.grad,
            "only_logprobs": only_logprobs,
            "collectives": sum(e.count for e in events if e.key.startswith("c10d::")),
            "host_reads": sum(e.count for e in events if e.key == "aten::_local_scalar_dense")}


def test_tp1_logprobs_and_entropy_match_reference_without_collectives_or_host_reads():
    temperature = 0.7
    (result,) = run_distributed(_one_rank, world_size=1, args=(temperature,))
    logprobs, entropy, grad = _reference(temperature)
    torch.testing.assert_close(result["logprobs"], logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result["only_logprobs"], logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result["entropy"], entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result["grad"], grad, rtol=1e-4, atol=1e-5)
    assert torch.all(result["grad"][..., VOCAB:] == 0)
    # at TP 1 the reductions are local: no collective, and no host read (megatron's kernel made 4 and a sync)
    assert result["collectives"] == 0 and result["host_reads"] == 0


def _chunked(temperature: float, chunk_tokens: int, packed: bool) -> dict:
    """Chunks of whole rows, or (packed: all rows as one long row) pieces of a row; the input a view, as
    ModelRole.logprobs passes logits[:, :-1]."""
    from megatron_adapters import logprobs as lp
    from megatron_adapters.process_groups import build_role_groups

    pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    lp.CHUNK_TOKENS = chunk_tokens
    full = torch.cat([_full_logits(), torch.zeros(3, 1, PADDED)], dim=1).requires_grad_()  # one extra column
    logits, targets = full[:, :-1], _targets()
    if packed:
        logits, targets = logits.reshape(1, 15, PADDED), targets.reshape(1, 15)
    logprobs, entropy = lp.token_logprobs(logits, targets, pgs.tp, temperature=temperature, with_entropy=True)
    w_logprob, w_entropy = (w.reshape(logprobs.shape) for w in _weights())
    (logprobs * w_logprob + entropy * w_entropy).sum().backward()
    unchanged = torch.equal(full.detach()[:, :-1], _full_logits())
    return {"logprobs": logprobs.detach().reshape(3, 5), "entropy": entropy.detach().reshape(3, 5),
            "grad": full.grad, "unchanged": unchanged}


@pytest.mark.parametrize("chunk_tokens, packed, temperature", [(10, False, 0.7), (4, True, 0.7), (10, False, 1.0)])
def test_tp1_chunks_of_rows_or_of_one_long_row_match_reference_values_and_grads(chunk_tokens, packed, temperature):
    """10 tokens: chunks of 2 rows and 1 row; packed, 4 tokens: a 15-token row in 4 pieces; at temperature 1 the
    fp32 logits themselves are read (and must not be written)."""
    (result,) = run_distributed(_chunked, world_size=1, args=(temperature, chunk_tokens, packed))
    logprobs, entropy, grad = _reference(temperature)
    torch.testing.assert_close(result["logprobs"], logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result["entropy"], entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result["grad"][:, :-1], grad, rtol=1e-4, atol=1e-5)
    assert torch.all(result["grad"][:, -1] == 0)  # the column the view left out
    assert result["unchanged"]  # the model's logits are never written to


def _saved_for_backward() -> dict:
    from megatron_adapters.logprobs import token_logprobs
    from megatron_adapters.process_groups import build_role_groups

    pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    logits = _full_logits().bfloat16().requires_grad_()
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs, entropy = token_logprobs(logits, _targets(), pgs.tp, temperature=0.7, with_entropy=True)
    (logprobs.sum() + entropy.sum()).backward()
    return {"saved": saved, "grad_dtype": logits.grad.dtype, "grad": logits.grad.float()}


def test_backward_keeps_the_model_dtype_logits_and_per_token_figures_only():
    """No [b, s, vocab] fp32 copy or probabilities are kept for backward (the 16k-token update of a 128k
    vocabulary needed ~40 GB for them); the gradient comes back in the logits' dtype."""
    (result,) = run_distributed(_saved_for_backward, world_size=1)
    vocab_sized = [s for s in result["saved"] if s[1][-1:] == (PADDED,)]
    assert vocab_sized == [(torch.bfloat16, (3, 5, PADDED))]
    assert all(shape == (3, 5) for _, shape in result["saved"] if (_, shape) not in vocab_sized)
    assert result["grad_dtype"] == torch.bfloat16
    full = _full_logits().bfloat16().float().requires_grad_()
    log_p = torch.log_softmax(full / 0.7, dim=-1)
    (log_p.gather(-1, _targets().unsqueeze(-1)).sum() - (log_p.exp() * log_p).sum()).backward()
    torch.testing.assert_close(result["grad"], full.grad, rtol=2e-2, atol=2e-2)


@pytest.mark.slow  # torch.compile builds its CPU kernels here (~1 min)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_chunks_equal_the_eager_ones(dtype, monkeypatch):
    """`compiled=True` (torch.compile'd exp sums and logit gradient) against the eager chunks: same values and
    gradients to fp32 summation order, over chunks of two sizes (the last one shorter)."""
    import torch.distributed as dist

    from megatron_adapters import logprobs as lp
    from megatron_adapters.logprobs import token_logprobs

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    group = dist.new_group([dist.get_rank()])
    monkeypatch.setattr(lp, "CHUNK_TOKENS", 16)
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 7, 50, generator=gen) * 4).to(dtype)
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    w_logprob, w_entropy = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    out = {}
    for compiled in (False, True):
        x = logits.clone().requires_grad_()
        logp, ent = token_logprobs(x, targets, group, temperature=0.7, with_entropy=True, compiled=compiled)
        (logp * w_logprob + ent * w_entropy).sum().backward()
        out[compiled] = (logp.detach(), ent.detach(), x.grad.float())
    if owned:
        dist.destroy_process_group()
    for eager, fused in zip(out[False], out[True], strict=True):
        torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-2)
    assert not torch.equal(out[False][0], torch.zeros_like(out[False][0]))
