"""PPO's clipped surrogate policy loss (Schulman et al., 2017), per token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# exp of a log-ratio past this is no longer a ratio but an overflow: float32 exp(89) is inf (a NaN gradient
# through torch.maximum) and float64 exp(25) with A < 0 is a 1e10 loss. +-20 (a ratio of 4.9e8) is far outside
# any clip range, so the clamp never changes a loss the clip would keep.
LOG_RATIO_MAX = 20.0


def clamped_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(log_ratio) with the log-ratio clamped to +-LOG_RATIO_MAX (no gradient beyond the clamp)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX))


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) with r = pi / pi_old, and where it clipped.

    r = exp(clamp(log pi - log pi_old, +-LOG_RATIO_MAX)), so loss and gradient stay finite.

    Returns (loss, clipped), both shaped like `logprobs`; the caller applies the response mask.
    `clipped` marks tokens whose gradient the clip removed (the clipped branch was the pessimistic one).
    With `clip_ratio_c` (dual clip), tokens with A < 0 pay at most -A * clip_ratio_c.
    """
    ratio = clamped_ratio(logprobs - old_logprobs)
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
