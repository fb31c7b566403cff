"""What every advantage estimator returns (one file per estimator in this folder)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Advantages(NamedTuple):
    """Per-token advantages [B, T] (0 where masked out) and critic targets (None without a critic)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None
