"""PPO's clipped surrogate policy loss (Schulman et al., 2017), per token."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class TokenClip:
    """PPO's per-token clipped surrogate as a policy-loss object (GSPO's sequence variant: gspo_clip.py).

    `clip_high` None: symmetric (= clip_low); DAPO's clip-higher sets it above clip_low.
    """

    clip_low: float = 0.2
    clip_high: float | None = None
    clip_ratio_c: float | None = None

    def __call__(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        clip_high = self.clip_low if self.clip_high is None else self.clip_high
        return ppo_policy_loss(logprobs, old_logprobs, advantages, self.clip_low, clip_high, self.clip_ratio_c)
