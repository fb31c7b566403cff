"""What the trainer calls an algorithm's pieces with: any object of these shapes fits (no closed union)."""

from __future__ import annotations

from typing import Protocol

import torch

from hybridflow.algorithms.advantages.base import Advantages


class AdvantageEstimator(Protocol):
    """Token rewards [B, T] (+ the critic's values [B, T] where the algorithm has a critic) -> advantages."""

    def __call__(self, token_rewards: torch.Tensor, mask: torch.Tensor,
                 values: torch.Tensor | None) -> Advantages: ...


class PolicyLoss(Protocol):
    """Per-token policy loss [B, T] and a clipped-token mask [B, T] from new/old log-probs and advantages."""

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class ScoreShaping(Protocol):
    """Per-sample scores [B] -> shaped scores [B] before advantages (e.g. DAPO's over-long penalty)."""

    def __call__(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...


class GroupFilter(Protocol):
    """Which rows to keep [B] from the shared scores, and how many more prompt batches a step may draw."""

    max_extra_draws: int

    def keep(self, scores: torch.Tensor) -> torch.Tensor: ...
