"""GSPO's sequence-level clipped policy loss (Zheng et al., 2025, "Group Sequence Policy Optimization").

The importance ratio is the sequence likelihood ratio normalised by length, s = exp(mean_t (log pi - log
pi_old)) over the response tokens (the geometric mean of the token ratios), and the clip is applied to s, so a
whole response is kept or clipped together: per sequence -min(s A, clip(s, 1 - clip_low, 1 + clip_high) A).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.losses.ppo_clip import clamped_ratio
from hybridflow.algorithms.masked import masked_mean


def sequence_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence loss and clip flag [B] from [B, T] token tensors; a sequence's advantage is the mean of
    its tokens' (GSPO gives every token of a response the same one). The mean log-ratio is clamped as PPO's
    (ppo_clip.LOG_RATIO_MAX)."""
    ratio = clamped_ratio(masked_mean(logprobs - old_logprobs, mask, dim=1))
    adv = masked_mean(advantages, mask, dim=1)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@dataclass(frozen=True)
class SequenceClip:
    """GSPO's policy loss. Returns the sequence loss on each of its response tokens, so averaging tokens
    within a sequence and then over sequences (`loss_agg_mode=seq-mean-token-mean`) is the mean over
    sequences of their loss."""

    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def __call__(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss, clipped = sequence_clip_loss(logprobs, old_logprobs, advantages, mask, self.clip_low,
                                           self.clip_high)
        shape = logprobs.shape
        return loss[:, None].expand(shape), clipped[:, None].expand(shape)
