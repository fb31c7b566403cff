"""Truncated importance sampling for samples drawn by a policy other than the one PPO's ratio is taken against.

The rollout engine samples with its own weights (one update stale at `trainer.rollout_lag=1`) and its own
numerics (bf16 kernels); PPO's ratio is against `old_logprobs`, the actor's recomputation before the update.
Weighting each token's policy loss by min(pi_old / pi_rollout, cap) corrects the sampling distribution
(Espeholt et al., 2018, IMPALA's truncated weights); the cap bounds the variance.
"""

from __future__ import annotations

import torch


def truncated_is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token min(exp(old - rollout), cap), without gradient (a fixed weight on the loss)."""
    return torch.exp(old_logprobs - rollout_logprobs).clamp(max=cap).detach()
