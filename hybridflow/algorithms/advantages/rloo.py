"""REINFORCE leave-one-out (RLOO, Ahmadian et al., 2024): each sample's baseline is the mean score of the
other samples of its prompt, so no critic is needed and the baseline does not include the sample itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.advantages.base import Advantages


def leave_one_out_scores(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """score_i - mean of the other group_size - 1 scores of its group; `scores` [B] holds groups together.

    Equal to (score_i - group mean) * n / (n - 1); written as the sum form so it reads like its definition.
    """
    groups = scores.view(-1, group_size)
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)


@dataclass(frozen=True)
class LeaveOneOut:
    """RLOO's estimator: the sequence score minus the leave-one-out baseline, on every response token."""

    group_size: int

    def __call__(
        self, token_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None
    ) -> Advantages:
        per_sample = leave_one_out_scores((token_rewards * mask).sum(dim=1), self.group_size)
        return Advantages((per_sample[:, None] * mask).detach(), None)
