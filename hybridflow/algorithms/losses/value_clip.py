"""PPO's clipped value loss, per token: the critic may not move further than `cliprange` per update."""

from __future__ import annotations

import torch


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, +-cliprange).

    Returns (loss, clipped) shaped like `values`; `clipped` marks tokens where the clip was active and its term
    was larger. Inside the range V_clip equals V only up to rounding, so `clipped > unclipped` alone would be
    a coin toss there.
    """
    delta = values - old_values
    values_clipped = old_values + torch.clamp(delta, -cliprange, cliprange)
    unclipped = (values - returns) ** 2
    clipped = (values_clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (delta.abs() > cliprange) & (clipped > unclipped)
