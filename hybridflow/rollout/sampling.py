"""Token sampling from full-vocabulary logits: temperature, top-k, top-p, and the log-prob that PPO uses."""

from __future__ import annotations

import torch

from hybridflow.rollout.base import SamplingParams


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return (tokens [B], logprobs [B]).

    The log-prob is taken under log_softmax(logits / temperature) before top-k/top-p filtering, the same
    quantity the actor recomputes in training, so the parity gate compares like with like.
    """
    logits = logits.float()
    if sampling.temperature <= 0:  # greedy
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    filtered = logp.clone()
    if sampling.top_k > 0:
        kth = torch.topk(filtered, min(sampling.top_k, filtered.size(-1)), dim=-1).values[:, -1:]
        filtered[filtered < kth] = float("-inf")
    if sampling.top_p < 1.0:
        sorted_logp, order = torch.sort(filtered, dim=-1, descending=True)
        cumulative = sorted_logp.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token once the mass before it already reaches top_p; the first token always stays.
        drop_sorted = (cumulative - sorted_logp.softmax(dim=-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered[drop] = float("-inf")
    probs = filtered.softmax(dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
