"""Token sampling from full-vocabulary logits: temperature, top-k, top-p, and the log-prob that PPO uses."""

from __future__ import annotations

import torch

from hybridflow.rollout.base import SamplingParams


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return (tokens [B], logprobs [B]).

    The log-prob is taken under log_softmax(logits / temperature) before top-k/top-p filtering, the same
    quantity the actor recomputes in training, so the parity gate compares like with like. `noise`: the Exp(1)
    draws of the race below, fp32 like `logits` (default: drawn here from `generator`).
    """
    logits = logits.float()
    if sampling.temperature <= 0:  # greedy
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    filtered = logp
    # masked_fill, not boolean-index assignment: the latter finds the indices on the host (a sync per step).
    if sampling.top_k > 0:
        kth = torch.topk(filtered, min(sampling.top_k, filtered.size(-1)), dim=-1).values[:, -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logp, order = torch.sort(filtered, dim=-1, descending=True)
        sorted_p = sorted_logp.softmax(dim=-1)
        # Drop a token once the mass before it already reaches top_p; the first token always stays.
        drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= sampling.top_p
        filtered = filtered.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    # Exponential race: argmax p_i / E_i over E_i ~ Exp(1) draws i with probability p_i, as torch.multinomial
    # does for one sample, without multinomial's host-side validity checks (two syncs per decode step).
    # A draw of exactly 0 would turn a filtered token's 0 / 0 into NaN, hence the clamp.
    probs = filtered.softmax(dim=-1)
    if noise is None:
        noise = torch.empty_like(probs).exponential_(generator=generator)
    race = noise.clamp(min=torch.finfo(probs.dtype).tiny)
    tokens = (probs / race).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
