"""The optimizer share an offloading role keeps in host memory, when the config leaves it to the planner.

`roles.<role>.offload_fraction` unset (null) with `offload_optimizer=true`: the planner picks the smallest
share, in steps of OFFLOAD_FRACTION_STEP, that brings every GPU within its capacity less the headroom (the
less is offloaded, the less host memory and host<->device traffic a step costs); the host-memory check
then runs on that share. Every such role on the plan gets the same share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hybridflow.config.experiment import ExperimentConfig, with_role_settings
from hybridflow.role_records import role_record

OFFLOAD_FRACTION_STEP = 0.05


def roles_to_pick(cfg: ExperimentConfig, roles: tuple[str, ...]) -> tuple[str, ...]:
    """The trained roles among `roles` that offload with the share left to the planner."""
    return tuple(r for r in roles if role_record(r).trained and cfg.roles.get(r).offload_optimizer
                 and cfg.roles.get(r).offload_fraction is None)


def with_offload_fraction(cfg: ExperimentConfig, roles: tuple[str, ...], fraction: float) -> ExperimentConfig:
    """A copy of `cfg` whose `roles` offload `fraction` of their optimizer."""
    return with_role_settings(cfg, {r: {"offload_fraction": fraction} for r in roles})


def offload_fractions(cfg: ExperimentConfig, roles: tuple[str, ...]) -> dict[str, float]:
    """Role -> the share of its optimizer on the host, for the roles of `roles` that offload (resolved cfg)."""
    return {r: float(cfg.roles.get(r).offload_fraction if cfg.roles.get(r).offload_fraction is not None else 1.0)
            for r in roles if role_record(r).trained and cfg.roles.get(r).offload_optimizer}


def pick_offload_fraction(
    cfg: ExperimentConfig,
    roles: tuple[str, ...],
    gpu_totals: Callable[[ExperimentConfig], Mapping[int, int]],
    usable_bytes: float,
) -> float:
    """The smallest share (a multiple of OFFLOAD_FRACTION_STEP) at which `gpu_totals` (rank -> estimated
    bytes for a config) stays within `usable_bytes` on every rank; 1.0 when even that does not fit (the
    memory check then refuses the plan with its numbers). GPU memory is linear in the share."""
    none, full = gpu_totals(with_offload_fraction(cfg, roles, 0.0)), gpu_totals(with_offload_fraction(cfg, roles, 1.0))
    needed = 0.0
    for rank, total in none.items():
        movable = total - full[rank]
        if total > usable_bytes:
            needed = max(needed, (total - usable_bytes) / movable if movable else math.inf)
    if needed >= 1.0:
        return 1.0
    steps = math.ceil(round(needed / OFFLOAD_FRACTION_STEP, 9))
    return round(min(1.0, steps * OFFLOAD_FRACTION_STEP), 4)
