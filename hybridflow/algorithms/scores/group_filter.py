"""DAPO's dynamic sampling criterion (Yu et al., 2025, sec. 3.2): a prompt whose n samples all got the same
score has a zero group-relative advantage, so it contributes no gradient but still dilutes the batch; such
groups are dropped and more prompts are drawn until the batch is full (the loop: trainer/dynamic_sampling.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def varied_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per-row keep mask [B]: True for the rows of groups whose scores are not all equal. Exact comparison
    on the shared scores, so every rank takes the same decision."""
    groups = scores.view(-1, group_size)
    varied = (groups != groups[:, :1]).any(dim=1)
    return varied.repeat_interleave(group_size)


@dataclass(frozen=True)
class DropUniformGroups:
    """Keep groups with varied scores; draw at most `max_extra_draws` more prompt batches per step."""

    group_size: int
    max_extra_draws: int

    def keep(self, scores: torch.Tensor) -> torch.Tensor:
        return varied_groups(scores, self.group_size)
