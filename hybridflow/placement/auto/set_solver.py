"""Best strategies for the roles of one colocation set on a given number of GPUs, under the memory limit.

Roles of a set share every GPU of the set, so their memory adds up (the memory estimator counts the
rollout's KV cache as the engine reserves it). Each role's candidate strategies are cut to the Pareto front
of (memory, time), then a branch-and-bound over the roles picks the combination with the least summed time
that fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridflow.placement.auto.cost_model import role_stage_breakdown, role_stage_times
from hybridflow.placement.auto.device import DeviceSpec, Efficiency
from hybridflow.placement.auto.strategy import Strategy, no_strategy_reason, strategies_for
from hybridflow.placement.auto.workload import STAGES, Workload
from hybridflow.units import GIB

# (role name, strategy) -> (bytes per GPU on the role's busiest rank, KV-cache bytes per GPU the rollout
# may fill). For the actor the bytes include the rollout colocated with it (at the strategy's gen_tp);
# None = the layout is invalid for the estimator.
MemoryFn = Callable[[str, Strategy], tuple[float, float] | None]


@dataclass(frozen=True)
class RoleChoice:
    role: str
    strategy: Strategy
    memory_bytes: float
    stage_times: dict[str, float]
    breakdown: dict[str, dict[str, float]] = field(default_factory=dict, compare=False)  # stage -> parts

    @property
    def total(self) -> float:
        return sum(self.stage_times.values())


@dataclass(frozen=True)
class SetSolution:
    """The chosen strategies of one set on `gpus` GPUs, or why there are none (`reason`)."""

    roles: tuple[str, ...]
    gpus: int
    choices: tuple[RoleChoice, ...] = ()
    memory_bytes: float = 0.0
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return bool(self.choices)

    def stage_parts(self, stage: str) -> dict[str, float]:
        """Seconds of the set in `stage` by cost component, summed over its roles."""
        out: dict[str, float] = {}
        for c in self.choices:
            for part, t in c.breakdown.get(stage, {}).items():
                out[part] = out.get(part, 0.0) + t
        return out

    def stage_time(self, stage: str) -> float:
        """Roles of a set run one after another, so the set's time in a stage is their sum."""
        return sum(c.stage_times.get(stage, 0.0) for c in self.choices)

    @property
    def stage_times(self) -> dict[str, float]:
        return {s: self.stage_time(s) for s in STAGES}


Option = tuple[float, dict[str, float], Strategy]  # (memory bytes, stage times, strategy)


def _pareto(options: list[Option]) -> list[Option]:
    """Keep the options that no other option beats on both memory and total time (fastest first)."""
    front: list[Option] = []
    for option in sorted(options, key=lambda o: (sum(o[1].values()), o[0], o[2])):
        if not front or option[0] < min(f[0] for f in front):
            front.append(option)
    return front


class SetSolver:
    """Cached per (set, GPU count): the search asks for the same set at the same size many times."""

    def __init__(self, workload: Workload, device: DeviceSpec, eff: Efficiency, memory: MemoryFn,
                 capacity_bytes: float):
        self.workload, self.device, self.eff, self.memory = workload, device, eff, memory
        self.capacity = capacity_bytes
        self._role_cache: dict[tuple[str, int], list[Option]] = {}
        self._set_cache: dict[tuple[tuple[str, ...], int], SetSolution] = {}

    def role_options(self, name: str, gpus: int) -> list[Option]:
        """Pareto front of (memory, stage times, strategy) of one role alone on `gpus` GPUs."""
        key = (name, gpus)
        if key not in self._role_cache:
            role = self.workload.role(name)
            options = []
            for s in strategies_for(role, gpus, self.device, self.workload):
                estimate = self.memory(name, s)
                if estimate is None or estimate[0] > self.capacity:
                    continue
                mem, kv = estimate
                times = role_stage_times(role, s, self.workload, self.device, self.eff, kv)
                if math.isfinite(sum(times.values())):
                    options.append((mem, times, s))
            self._role_cache[key] = _pareto(options)
        return self._role_cache[key]

    @property
    def solves(self) -> int:
        """(set, GPU count) pairs solved so far."""
        return len(self._set_cache)

    def solve(self, roles: tuple[str, ...], gpus: int) -> SetSolution:
        key = (roles, gpus)
        if key not in self._set_cache:
            self._set_cache[key] = self._solve(roles, gpus)
        return self._set_cache[key]

    def _breakdown(self, name: str, s: Strategy) -> dict[str, dict[str, float]]:
        kv = self.memory(name, s)[1]  # the estimate was valid when the option was kept
        return role_stage_breakdown(self.workload.role(name), s, self.workload, self.device, self.eff, kv)

    def _solve(self, roles: tuple[str, ...], gpus: int) -> SetSolution:
        fronts = [self.role_options(r, gpus) for r in roles]
        for r, front in zip(roles, fronts, strict=True):
            if front:
                continue
            role = self.workload.role(r)
            if not strategies_for(role, gpus, self.device, self.workload):
                why = "no layout: " + no_strategy_reason(role, gpus, self.device, self.workload)
            else:
                why = "no layout fits memory alone"
            return SetSolution(roles, gpus, reason=f"{r} on {gpus} GPUs: {why}")
        min_mem = [min(o[0] for o in f) for f in fronts]
        min_time = [min(sum(o[1].values()) for o in f) for f in fronts]
        if sum(min_mem) > self.capacity:
            return SetSolution(roles, gpus, reason=f"needs {sum(min_mem) / GIB:.1f} GiB per GPU on {gpus} "
                                                   f"GPUs, more than {self.capacity / GIB:.1f} GiB")
        best: list[tuple[float, tuple[int, ...]]] = []

        def walk(i: int, mem: float, time: float, picked: tuple[int, ...]) -> None:
            # Branch and bound: the cheapest completion must still fit and still beat the best so far.
            if mem + sum(min_mem[i:]) > self.capacity:
                return
            if best and time + sum(min_time[i:]) >= best[0][0]:
                return
            if i == len(roles):
                best[:] = [(time, picked)]
                return
            for j, (m, times, _) in enumerate(fronts[i]):
                walk(i + 1, mem + m, time + sum(times.values()), picked + (j,))

        walk(0, 0.0, 0.0, ())
        if not best:
            return SetSolution(roles, gpus, reason=f"no combination of strategies fits on {gpus} GPUs")
        choices = tuple(RoleChoice(r, fronts[i][j][2], fronts[i][j][0], fronts[i][j][1],
                                   self._breakdown(r, fronts[i][j][2]))
                        for i, (r, j) in enumerate(zip(roles, best[0][1], strict=True)))
        return SetSolution(roles, gpus, choices, sum(c.memory_bytes for c in choices))
