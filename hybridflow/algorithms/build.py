"""Pick the advantage estimator for `algorithm.name`; the only place the name is looked at."""

from __future__ import annotations

from hybridflow.algorithms.gae import GAE
from hybridflow.algorithms.grpo import GroupNormalized
from hybridflow.errors import UserError

AdvantageEstimator = GAE | GroupNormalized


def build_advantage_estimator(
    name: str, *, gamma: float, lam: float, whiten: bool, group_size: int, scale_by_std: bool = True
) -> AdvantageEstimator:
    """PPO: GAE over critic values (whitened if asked); GRPO: centred (and, with `scale_by_std`, divided by
    the std) within groups of `group_size`."""
    if name == "ppo":
        return GAE(gamma=gamma, lam=lam, whiten=whiten)
    if name == "grpo":
        if group_size < 2:
            raise UserError(
                f"rollout.n_samples_per_prompt: GRPO compares a prompt's samples, got {group_size}; set >= 2"
            )
        return GroupNormalized(group_size=group_size, scale_by_std=scale_by_std)
    raise UserError(f"algorithm.name: unknown {name!r}; set 'ppo' or 'grpo'")
