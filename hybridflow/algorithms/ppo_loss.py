"""PPO's clipped surrogate policy loss (Schulman et al., 2017), per token."""

from __future__ import annotations

import torch


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) with r = pi / pi_old, and where it clipped.

    Returns (loss, clipped), both shaped like `logprobs`; the caller applies the response mask.
    `clipped` marks tokens whose gradient the clip removed (the clipped branch was the pessimistic one).
    With `clip_ratio_c` (dual clip), tokens with A < 0 pay at most -A * clip_ratio_c.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_ratio_c), loss)
    return loss, clipped > unclipped
