"""DAPO's soft over-long penalty (Yu et al., 2025, sec. 3.4): responses that run into the last `buffer`
tokens before the length limit lose reward linearly, reaching `-penalty` at the limit, so the policy learns
to finish before truncation instead of being punished only by a truncated (wrong) answer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float) -> torch.Tensor:
    """Per-sample reward change [B]: 0 up to max_length - buffer tokens, then -penalty * (excess / buffer),
    i.e. -penalty at max_length (and beyond, for a response longer than the limit)."""
    excess = (lengths.float() - (max_length - buffer)).clamp(min=0, max=buffer)
    return -penalty * excess / buffer


@dataclass(frozen=True)
class OverlongPenalty:
    """Reward shaping: add `overlong_penalty` of each response's length to its score."""

    max_length: int
    buffer: int
    penalty: float = 1.0

    def __call__(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return scores + overlong_penalty(mask.sum(dim=1), self.max_length, self.buffer, self.penalty)
