"""Group-normalised advantages (GRPO, Shao et al., 2024): n samples per prompt, no critic."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.advantages.base import Advantages
from hybridflow.errors import UserError


def group_normalized_scores(
    scores: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """(score - group mean) / (group std + eps) per sample; `scores` [B] holds each prompt's samples together.

    The std is the unbiased sample std, so a group of identical scores gets advantage 0 everywhere.
    """
    if group_size < 1 or scores.shape[0] % group_size:
        raise UserError(
            f"rollout.n_samples_per_prompt: {group_size} does not divide the batch of {scores.shape[0]} "
            "samples; set it to a divisor of the number of samples per step"
        )
    groups = scores.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale_by_std and group_size > 1:
        scale = groups.std(dim=1, keepdim=True) + eps
        centred = torch.where(scale > 0, centred / scale, 0.0)  # all-equal group with eps=0: 0, not NaN
    return centred.reshape(-1)


@dataclass(frozen=True)
class GroupNormalized:
    """GRPO's estimator: a sequence's score is the sum of its token rewards, normalised within its group
    and given to each of its response tokens."""

    group_size: int
    scale_by_std: bool = True
    eps: float = 1e-6

    def __call__(
        self, token_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None
    ) -> Advantages:
        scores = (token_rewards * mask).sum(dim=1)
        per_sample = group_normalized_scores(scores, self.group_size, self.scale_by_std, self.eps)
        return Advantages((per_sample[:, None] * mask).detach(), None)
