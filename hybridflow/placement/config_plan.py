"""`plan_placement`: a config's plan, from its explicit `placement.resources` or from the auto search.

Its own module so the imports point one way: this one uses both the explicit planner and `auto` (and
`engine_choice`, which uses both), and `auto` builds its chosen plan through the explicit planner's checks.
"""

from __future__ import annotations

from hybridflow.config.experiment import ExperimentConfig
from hybridflow.engines import AUTO
from hybridflow.placement.auto import plan_auto
from hybridflow.placement.engine_choice import choose_engine
from hybridflow.placement.planner import Plan, build_plan, resolve_resources


def plan_placement(cfg: ExperimentConfig) -> Plan:
    """The plan for `cfg`: explicit `placement.resources`, or the auto planner for `placement.mode=auto`;
    with `rollout.engine=auto`, the plan of the engine predicted faster (`Plan.rollout_engine` names it)."""
    if cfg.rollout.engine == AUTO:
        return choose_engine(cfg).plan
    if cfg.placement.mode == "auto":
        return plan_auto(cfg)
    return build_plan(cfg, resolve_resources(cfg))
