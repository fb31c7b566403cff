"""How a mini-batch's per-token losses become one number, independent of how rows fall into micro-batches.

megatron-core's schedule divides each micro-batch's loss by the number of micro-batches and its DDP averages
gradients over the data-parallel replicas. A micro-batch that returns `numerator * n_micro * dp / count`,
with `count` taken over the whole mini-batch on every replica, therefore yields the gradient of
`sum(numerators) / count` whatever the micro-batch size or DP:

  token-mean           sum of token losses / tokens of the mini-batch
  seq-mean-token-mean  sum over sequences of their token-mean loss / sequences with a response
  seq-mean-token-sum   sum of token losses / sequences with a response
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.masked import masked_sum
from hybridflow.config.algorithm import LOSS_AGG_MODES

__all__ = ["LOSS_AGG_MODES", "local_count", "micro_batch_scale", "numerator"]


def local_count(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """This replica's share of the denominator: response tokens (token-mean) or sequences with a response."""
    if mode == "token-mean":
        return mask.sum().float()
    return (mask.sum(dim=1) > 0).sum().float()


def numerator(token_loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The micro-batch's part of the numerator, from the per-token loss [B, T] and its mask.

    A masked sum (`where`, not `* mask`): an inf/NaN token loss in padding neither reaches the value nor the
    gradient."""
    per_seq = masked_sum(token_loss, mask, dim=1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(dim=1).clamp(min=1)
    return per_seq.sum()


def micro_batch_scale(n_micro: int, dp: int, global_count: float) -> float:
    """The factor that undoes megatron's per-micro-batch and per-replica averaging (module docstring).

    `n_micro` is the number of micro-batches of this replica's schedule call: fixed-size micro-batches or
    packed ones (whose count varies with the lengths; packed micro-batches hold whole sequences, so the
    per-sequence numerators are unchanged)."""
    return n_micro * dp / max(global_count, 1.0)
