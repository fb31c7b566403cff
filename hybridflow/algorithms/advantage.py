"""What every advantage estimator returns (GAE in gae.py, group-normalised in grpo.py)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Advantages(NamedTuple):
    """Per-token advantages [B, T] (0 where masked out) and critic targets (None without a critic)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None
