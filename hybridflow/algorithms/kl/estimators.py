"""Per-token KL estimators (Schulman, "Approximating KL divergence", 2020) and the KL reward penalty.

Each estimates KL(pi || ref) from tokens sampled from pi, given log pi(x) and log ref(x) of those tokens.
With log_ratio = log ref(x) - log pi(x):
  k1 = -log_ratio                         unbiased, high variance, can be negative
  k2 = log_ratio**2 / 2                   biased, low variance, >= 0
  k3 = exp(log_ratio) - 1 - log_ratio     unbiased, low variance, >= 0; clamped at K3_MAX per token (the
                                          usual guard: exp makes one far-off token dominate the batch)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridflow.algorithms.masked import last_masked_index
from hybridflow.errors import UserError

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
K3_MAX = 10.0


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1: log pi - log ref per token."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2: half the squared log-ratio per token."""
    return 0.5 * (ref_logprobs - logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 ("low variance"): r - 1 - log r with r = ref / pi per token."""
    log_ratio = (ref_logprobs - logprobs).clamp(max=2 * K3_MAX)  # keeps exp finite before the clamp below
    return (torch.exp(log_ratio) - 1 - log_ratio).clamp(max=K3_MAX)


KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimator(name: str, key: str = "algorithm.kl_estimator") -> KLEstimator:
    """The estimator called `name` ("k1" | "k2" | "k3"); `key` is the config field that named it."""
    if name not in KL_ESTIMATORS:
        raise UserError(f"{key}: unknown {name!r}; set one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]


def last_token_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar score [B] on its last masked-in token of a [B, T] zero tensor."""
    last = last_masked_index(mask)
    token_rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    has_tokens = last >= 0  # an empty response gets no reward: there is no action to credit
    rows = torch.arange(mask.shape[0], device=mask.device)[has_tokens]
    token_rewards[rows, last[has_tokens]] = scores[has_tokens]
    return token_rewards


def kl_penalized_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: KLEstimator = kl_k1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards r_t = score * [t is last] - kl_coef * KL_t, and the per-token KL [B, T] itself.

    The classic RLHF reward (Ziegler et al., 2019): the sequence score lands on the final token and every
    token pays for drifting from the reference. Both outputs are 0 where masked out.
    """
    kl = torch.where(mask.bool(), estimator(logprobs, ref_logprobs), 0.0)
    return last_token_scores(scores, mask) - kl_coef * kl, kl
