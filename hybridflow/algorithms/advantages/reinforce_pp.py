"""REINFORCE++ (Hu et al., 2025): critic-free, with advantages normalised over the whole batch instead of
within a prompt's group, which the paper argues is less prone to over-fitting easy prompts.

Two variants:
  ReinforcePP          A_t = discounted return of the token rewards from t on (KL penalty included when it
                       lives in the reward), whitened over every response token of the batch
  ReinforcePPBaseline  A = sequence score - its group's mean score (n samples per prompt), on every token,
                       then whitened over the batch
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.advantages.base import Advantages
from hybridflow.algorithms.masked import masked_whiten


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over masked-in tokens [B, T]; masked-out positions are skipped (they
    neither add a step nor end the response) and come back as 0."""
    mask = mask.bool()
    running = torch.zeros_like(token_rewards[:, 0])
    returns = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        step = token_rewards[:, t] + gamma * running
        running = torch.where(mask[:, t], step, running)
        returns[:, t] = torch.where(mask[:, t], step, 0.0)
    return returns


@dataclass(frozen=True)
class ReinforcePP:
    """REINFORCE++: batch-whitened discounted returns."""

    gamma: float = 1.0

    def __call__(
        self, token_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None
    ) -> Advantages:
        returns = discounted_returns(token_rewards, mask, self.gamma)
        return Advantages(masked_whiten(returns, mask).detach(), None)


@dataclass(frozen=True)
class ReinforcePPBaseline:
    """REINFORCE++-baseline: group-mean baseline per prompt, then batch whitening."""

    group_size: int

    def __call__(
        self, token_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None
    ) -> Advantages:
        groups = (token_rewards * mask).sum(dim=1).view(-1, self.group_size)
        centred = (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)
        return Advantages(masked_whiten(centred[:, None] * mask, mask).detach(), None)
