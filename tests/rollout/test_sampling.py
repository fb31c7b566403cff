import math

import torch

from hybridflow.rollout.base import SamplingParams
from hybridflow.rollout.sampling import sample_next


def _draws(logits, sampling, n=4000):
    gen = torch.Generator().manual_seed(0)
    toks, logps = sample_next(logits.expand(n, -1), sampling, gen)
    return toks, logps


def test_greedy_takes_argmax_with_its_logprob():
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    tok, logp = sample_next(logits, SamplingParams(max_new_tokens=1, temperature=0.0), None)
    assert tok.item() == 1
    expected = 2.0 - math.log(math.exp(0) + math.exp(2) + math.exp(1))
    assert abs(logp.item() - expected) < 1e-6


def test_top_k_keeps_only_k_tokens_and_logprob_is_unfiltered():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    toks, logps = _draws(logits, SamplingParams(max_new_tokens=1, top_k=2))
    assert set(toks.tolist()) == {0, 1}
    full = torch.log_softmax(logits[0], -1)
    assert torch.allclose(logps, full[toks])


def test_top_p_drops_the_tail():
    # probabilities 0.5, 0.3, 0.2: top_p 0.7 keeps the first two (0.5 < 0.7, 0.8 >= 0.7).
    probs = torch.tensor([[0.5, 0.3, 0.2]])
    toks, _ = _draws(probs.log(), SamplingParams(max_new_tokens=1, top_p=0.7))
    assert set(toks.tolist()) == {0, 1}
    frac0 = (toks == 0).float().mean().item()
    assert abs(frac0 - 0.5 / 0.8) < 0.04


def test_temperature_scales_the_distribution():
    logits = torch.tensor([[1.0, 0.0]])
    toks, logps = _draws(logits, SamplingParams(max_new_tokens=1, temperature=0.5))
    p0 = torch.softmax(logits[0] / 0.5, -1)[0].item()
    assert abs((toks == 0).float().mean().item() - p0) < 0.03
    assert torch.allclose(logps, torch.log_softmax(logits[0] / 0.5, -1)[toks])


def test_draw_frequencies_follow_the_probabilities():
    probs = torch.tensor([[0.4, 0.25, 0.2, 0.1, 0.05]])
    toks, _ = _draws(probs.log(), SamplingParams(max_new_tokens=1), n=40000)
    freq = torch.bincount(toks, minlength=5).float() / toks.numel()
    # 40000 draws: the standard error of each frequency is below 0.0025
    assert torch.allclose(freq, probs[0], atol=0.01), freq


def test_filtered_tokens_are_never_drawn():
    # nearly flat: without the filter almost every draw would land outside the top 3
    logits = -0.001 * torch.arange(1000, dtype=torch.float32)[None]
    toks, _ = _draws(logits, SamplingParams(max_new_tokens=1, top_k=3), n=20000)
    assert set(toks.tolist()) == {0, 1, 2}
