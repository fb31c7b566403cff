"""KL coefficient controllers: fixed, or adaptive toward a target KL (Ziegler et al., 2019, sec. 2.2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.masked import masked_sum
from hybridflow.errors import UserError


def sequence_kl(token_kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The KL the adaptive controller steers: each response's KL summed over its tokens, averaged over the
    responses that have at least one token (a scalar).

    A sum per response because that is the KL between response distributions, the quantity Ziegler et al.'s
    target (6 nats, `algorithm.kl_target`'s default) is measured in; a mean over all tokens would weigh long
    responses more and put the target on a per-token scale (verl averages token means per response first,
    a per-token rate near 0.1: its targets do not carry over). Padding cannot leak in (masked sums).
    """
    per_response = masked_sum(token_kl, mask, dim=1)
    has_tokens = mask.sum(dim=1) > 0
    return masked_sum(per_response, has_tokens) / has_tokens.sum().clamp(min=1)


@dataclass
class FixedKLController:
    """A constant KL coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Nothing to restore: the coefficient is the config's (`algorithm.kl_coef`, which a resume may change)."""


@dataclass
class AdaptiveKLController:
    """beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon) after each step.

    `n_steps` is how many samples (episodes) the step consumed, so `horizon` is counted in samples, as in the
    paper; the clip bounds how fast beta moves on a noisy KL estimate. `current_kl` is `sequence_kl` of the
    step's batch (nats per response).
    """

    value: float
    target: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """The adapted coefficient continues; target and horizon stay the config's, which a resume may change
        (a checkpoint of a fixed controller holds its coefficient too: adaptation starts from it)."""
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def build_kl_controller(
    kind: str, kl_coef: float, kl_target: float | None, kl_horizon: int | None
) -> KLController:
    """The controller named by `algorithm.kl_controller` ("fixed" | "adaptive")."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if not kl_target or kl_target <= 0 or not kl_horizon or kl_horizon <= 0:
            raise UserError(
                f"algorithm.kl_target/kl_horizon: adaptive KL needs both > 0, got {kl_target}, {kl_horizon}; "
                "set them, or algorithm.kl_controller=fixed"
            )
        return AdaptiveKLController(kl_coef, kl_target, kl_horizon)
    raise UserError(f"algorithm.kl_controller: unknown {kind!r}; set 'fixed' or 'adaptive'")
