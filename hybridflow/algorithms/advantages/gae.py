"""Generalised advantage estimation (Schulman et al., 2016) over token-level rewards and values."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.advantages.base import Advantages
from hybridflow.algorithms.masked import masked_whiten


def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, both [B, T], for per-token rewards and critic values under a response mask.

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where t+1 is the next
    masked-in token: masked-out positions are skipped (they neither end the episode nor add a step), and the
    value after the last masked-in token is 0 (the response is the whole episode). Returns = A + V.
    """
    mask = mask.bool()
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        # Masked-out positions pass the later token's state through unchanged.
        next_adv = torch.where(m, adv_t, next_adv)
        next_value = torch.where(m, values[:, t], next_value)
        advantages[:, t] = torch.where(m, adv_t, 0.0)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


@dataclass(frozen=True)
class GAE:
    """PPO's advantage estimator: GAE over a critic's values, optionally whitened over the batch."""

    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True

    def __call__(self, token_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor) -> Advantages:
        advantages, returns = gae_advantages(token_rewards, values, mask, self.gamma, self.lam)
        if self.whiten:
            advantages = masked_whiten(advantages, mask)
        return Advantages(advantages.detach(), returns.detach())
