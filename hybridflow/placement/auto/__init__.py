"""Automatic placement (HybridFlow EuroSys'25 Algorithm 1): colocation sets, GPU counts and per-role
TP/PP/DP chosen with a cost model, with an explanation of the choice.

`plan_auto(cfg)` is what `hybridflow.placement.plan_placement` calls for `placement.mode=auto`;
`search_placement(cfg)` also returns the `Explanation` (chosen plan, stage times, runners-up).
"""

from hybridflow.placement.auto.device import DeviceSpec, Efficiency, efficiency_for, load_calibration
from hybridflow.placement.auto.explain import Explanation, RunnerUp, explain
from hybridflow.placement.auto.from_config import (
    config_with_plan,
    memory_from_config,
    plan_auto,
    search_config,
    search_placement,
    workload_from_config,
)
from hybridflow.placement.auto.search import Candidate, SearchResult, search
from hybridflow.placement.auto.strategy import Strategy
from hybridflow.placement.auto.workload import ModelCostShape, RoleWork, Workload

__all__ = [
    "Candidate", "DeviceSpec", "Efficiency", "Explanation", "ModelCostShape", "RoleWork", "RunnerUp",
    "SearchResult", "Strategy", "Workload", "config_with_plan", "efficiency_for", "explain", "load_calibration",
    "memory_from_config", "plan_auto", "search", "search_config", "search_placement", "workload_from_config",
]
