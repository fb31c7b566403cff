"""Actor and critic losses for one micro-batch: per-token losses, their masked sum, and metrics.

A loss function returns `LossOutput(loss_sum, num_tokens, metrics, token_loss, mask)`: the first three are
megatron's (loss, num_tokens, reduced) triple; the per-token loss and its mask let `loss_agg` normalise over
the whole mini-batch (see `algorithm.loss_agg_mode`). Metrics are detached token sums; `token_means` turns
the sums of many micro-batches into means.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from hybridflow.algorithms.kl.estimators import kl_estimator, kl_k3
from hybridflow.algorithms.losses.ppo_clip import TokenClip
from hybridflow.algorithms.losses.value_clip import clipped_value_loss
from hybridflow.algorithms.masked import masked_sum
from hybridflow.algorithms.protocols import PolicyLoss


class LossOutput(NamedTuple):
    loss_sum: torch.Tensor  # scalar, differentiable: sum of the per-token loss over masked-in tokens
    num_tokens: torch.Tensor  # int scalar: masked-in tokens of this micro-batch
    metrics: dict[str, torch.Tensor]  # detached token sums (divide by total num_tokens)
    token_loss: torch.Tensor | None = None  # [B, T] per-token loss, 0 where masked out (for loss_agg)
    mask: torch.Tensor | None = None  # [B, T]


@dataclass(frozen=True)
class ActorLossConfig:
    """Actor loss: a clipped surrogate (per token, or per sequence for GSPO) - entropy bonus + optional
    KL-to-reference loss term."""

    policy: PolicyLoss = field(default_factory=TokenClip)
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0  # > 0: KL to the reference as a loss term (GRPO style) instead of in the reward
    kl_loss_estimator: str = "k3"


@dataclass(frozen=True)
class CriticLossConfig:
    cliprange_value: float = 0.2


def _padding_zeroed(mask: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Each tensor with its masked-out positions replaced by 0 (None stays None).

    Selected, not multiplied: padding may hold inf/NaN (log-probs of pad tokens, stale advantages), and both
    `x * 0` and the backward of any op fed an inf (exp, products) give NaN, which the optimizer would spread
    to every weight whatever the aggregation. `where` gives those positions a zero value and a zero gradient.
    """
    keep = mask.bool()
    return [None if t is None else torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device))
            for t in tensors]


def _output(loss: torch.Tensor, mask: torch.Tensor, terms: dict[str, torch.Tensor]) -> LossOutput:
    metrics = {name: masked_sum(term.detach().float(), mask) for name, term in terms.items()}
    (token_loss,) = _padding_zeroed(mask, loss)
    return LossOutput(masked_sum(loss, mask), mask.sum().to(torch.int), metrics, token_loss, mask)


def actor_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: ActorLossConfig,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> LossOutput:
    """Actor loss over [B, T] token tensors; `entropy` is needed when entropy_coef > 0, `ref_logprobs` when
    kl_loss_coef > 0; `is_weights` (hybridflow.algorithms.losses.truncated_is) weight each token's policy loss."""
    mask = mask.to(logprobs.dtype)
    logprobs, old_logprobs, advantages, entropy, ref_logprobs, is_weights = _padding_zeroed(
        mask, logprobs, old_logprobs, advantages, entropy, ref_logprobs, is_weights)
    pg_loss, clipped = cfg.policy(logprobs, old_logprobs, advantages, mask)
    if is_weights is not None:
        pg_loss = pg_loss * is_weights
    loss = pg_loss
    # KL(old || new) from tokens sampled by old: how far this update has moved the policy.
    terms = {"pg_loss": pg_loss, "clipfrac": clipped.float(), "approx_kl": kl_k3(old_logprobs, logprobs)}
    if cfg.entropy_coef:
        if entropy is None:
            raise ValueError("actor_loss: entropy_coef > 0 needs the per-token entropy")
        loss = loss - cfg.entropy_coef * entropy
    if entropy is not None:
        terms["entropy"] = entropy
    if is_weights is not None:
        terms["is_weight"] = is_weights
    if cfg.kl_loss_coef:
        if ref_logprobs is None:
            raise ValueError("actor_loss: kl_loss_coef > 0 needs the reference log-probs")
        kl = kl_estimator(cfg.kl_loss_estimator, "algorithm.kl_loss_estimator")(logprobs, ref_logprobs)
        loss = loss + cfg.kl_loss_coef * kl
        terms["kl_loss"] = kl
    return _output(loss, mask, terms)


def critic_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cfg: CriticLossConfig,
) -> LossOutput:
    """Clipped value loss over [B, T] token tensors."""
    mask = mask.to(values.dtype)
    values, old_values, returns = _padding_zeroed(mask, values, old_values, returns)
    loss, clipped = clipped_value_loss(values, old_values, returns, cfg.cliprange_value)
    return _output(loss, mask, {"vf_loss": loss, "vf_clipfrac": clipped.float(), "values": values})


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> LossOutput:
    """Supervised warm-up: negative log-likelihood of the target tokens (`logprobs` of the labels, [B, T])."""
    mask = mask.to(logprobs.dtype)
    (nll,) = _padding_zeroed(mask, -logprobs)
    return _output(nll, mask, {"nll": nll})


def token_means(outputs: Iterable[LossOutput]) -> dict[str, float]:
    """Token-weighted means of the metrics of several micro-batches (all-reduce the sums first for DP)."""
    totals: dict[str, torch.Tensor] = {}
    num_tokens = 0
    for out in outputs:
        num_tokens += int(out.num_tokens)
        for name, value in out.metrics.items():
            totals[name] = totals.get(name, 0.0) + value
    return {name: float(total) / max(num_tokens, 1) for name, total in totals.items()}
