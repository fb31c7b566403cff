"""HybridFlow (EuroSys'25) Algorithm 1: search colocation sets, GPU allocations and per-role strategies.

for each partition of the roles into colocation sets:
    minimum GPUs per set = the smallest size at which the set's roles fit memory together
    for each allocation of all the cluster's GPUs to the sets (each at least its minimum):
        per set, per role, the best (TP, PP, DP[, rollout TP]) that fits    (cached per set and size)
        stage time = sum over a set's roles active in the stage, max over sets (sets run in parallel)
        iteration time = sum of stage times
Keeps the best plan of every partition, so the explanation can say why each alternative lost.

At trainer.rollout_lag=1 the rollout is a role of its own that never shares a set with the actor, and the
iteration time overlaps its generation with the other stages (overlap.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hybridflow.errors import UserError
from hybridflow.placement.auto.device import DeviceSpec, Efficiency
from hybridflow.placement.auto.overlap import OneStepOff, one_step_off
from hybridflow.placement.auto.partitions import allocations, rank_ranges, set_partitions, set_sizes
from hybridflow.placement.auto.set_solver import MemoryFn, SetSolution, SetSolver
from hybridflow.placement.auto.workload import STAGES, Workload
from hybridflow.role_records import Role
from hybridflow.units import GIB


@dataclass(frozen=True)
class Candidate:
    """One complete placement: sets with their GPU ranges and strategies, and its predicted times."""

    sets: tuple[SetSolution, ...]
    ranks: tuple[Sequence[int], ...]  # each set's global ranks
    stage_times: dict[str, float]  # per stage, the slowest set's time
    overlap: OneStepOff | None = None  # rollout_lag=1: how generation overlaps the other stages

    @property
    def total(self) -> float:
        if self.overlap is not None:
            return self.overlap.total
        return sum(self.stage_times.values())

    @property
    def partition(self) -> tuple[tuple[str, ...], ...]:
        return tuple(s.roles for s in self.sets)

    def bottleneck(self, stage: str) -> SetSolution:
        """The set that takes longest in `stage` (the others wait for it)."""
        return max(self.sets, key=lambda s: s.stage_time(stage))


@dataclass
class PartitionResult:
    """The best candidate of one colocation partition, or why it has none."""

    partition: tuple[tuple[str, ...], ...]
    best: Candidate | None = None
    reason: str = ""
    allocations_tried: int = 0


@dataclass
class SearchResult:
    chosen: Candidate
    partitions: list[PartitionResult]  # every partition, best first; infeasible ones last
    world_size: int
    efficiency: Efficiency
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def runners_up(self) -> list[PartitionResult]:
        return [p for p in self.partitions if p.best is not self.chosen]


def compose(sets: tuple[SetSolution, ...], ranks: tuple[Sequence[int], ...], workload: Workload,
            device: DeviceSpec, eff: Efficiency) -> Candidate:
    """Sets with their strategies on `ranks` -> a candidate with its stage times (a set's roles add, sets run
    in parallel) and, at rollout_lag=1, the overlap of generation with the rest. The one composition: the
    search prices its allocations with it, `predict.plan_candidate` an explicit plan."""
    times = {stage: max(s.stage_time(stage) for s in sets) for stage in STAGES}
    overlap = one_step_off(sets, ranks, workload, device, eff) if workload.rollout_lag else None
    return Candidate(sets, ranks, times, overlap)


def _search_partition(partition, solver: SetSolver, device: DeviceSpec) -> PartitionResult:
    result = PartitionResult(partition)
    world, gpn = device.world_size, device.gpus_per_node
    sizes = set_sizes(world, gpn)
    minimum = []
    for roles in partition:
        fitting = [n for n in sizes if solver.solve(roles, n).feasible]
        if not fitting:
            result.reason = f"{{{', '.join(roles)}}} fits on no GPU count up to {world}: " \
                            f"{solver.solve(roles, world).reason}"
            return result
        minimum.append(fitting[0])
    if sum(minimum) > world:
        needs = ", ".join(f"{{{', '.join(r)}}} >= {m}" for r, m in zip(partition, minimum, strict=True))
        result.reason = (f"memory: the sets need {sum(minimum)} GPUs together ({needs}), "
                         f"the cluster has {world}")
        return result

    def allowed(i: int, size: int) -> bool:
        return solver.solve(partition[i], size).feasible

    for alloc in allocations(world, gpn, minimum, allowed):
        result.allocations_tried += 1
        sets = tuple(solver.solve(roles, n) for roles, n in zip(partition, alloc, strict=True))
        ranks = tuple(rank_ranges(alloc, gpn))
        cand = compose(sets, ranks, solver.workload, device, solver.eff)
        if result.best is None or cand.total < result.best.total:
            result.best = cand
    if result.best is None and len(partition) == 1:  # one set takes every GPU: its own reason decides
        result.reason = solver.solve(partition[0], world).reason
    elif result.best is None:
        result.reason = "no allocation of the cluster's GPUs gives every set a size with a valid strategy"
    return result


def _respects(partition: tuple[tuple[str, ...], ...], must_share: tuple[tuple[str, ...], ...]) -> bool:
    """Every required group (restricted to roles of the workload) lies inside one set."""
    for group in must_share:
        present = {r for r in group if any(r in s for s in partition)}
        if present and not any(present <= set(s) for s in partition):
            return False
    return True


def _rollout_apart(partition: tuple[tuple[str, ...], ...]) -> bool:
    """No set holds both the actor and the rollout (what rollout_lag=1 needs to overlap them)."""
    return not any(Role.ACTOR in s and Role.ROLLOUT in s for s in partition)


def _check_lag_fits(device: DeviceSpec, partitions: list) -> None:
    """rollout_lag=1 needs GPUs beside the actor's; say so rather than "nothing fits"."""
    if device.world_size < 2:
        raise UserError(f"trainer.rollout_lag: 1 generates on GPUs the actor does not hold, but the cluster has "
                        f"{device.world_size} GPU; set trainer.rollout_lag=0 or give the cluster at least 2 GPUs "
                        "(cluster.gpus_per_node, cluster.nodes)")
    if not partitions:
        raise UserError("trainer.rollout_lag: 1 needs the rollout on GPUs the actor does not hold, but "
                        "placement.colocate puts them together; drop that group or set trainer.rollout_lag=0")


def search(workload: Workload, device: DeviceSpec, memory: MemoryFn, eff: Efficiency | None = None,
           capacity_bytes: float | None = None,
           must_share: tuple[tuple[str, ...], ...] = ()) -> SearchResult:
    """Run Algorithm 1 and return the fastest placement with every partition's best for comparison.

    `memory(role, strategy)` is the memory estimator (bytes per GPU); the search never returns a plan whose
    colocated roles add up to more than `capacity_bytes` (default: the GPU's memory). `must_share` lists
    role groups the user requires colocated (placement.colocate). At `workload.rollout_lag` 1 only partitions
    with the rollout apart from the actor are searched. Deterministic: enumeration orders are
    fixed and ties keep the earlier candidate (the colocated partition comes first).
    """
    eff = eff or Efficiency()
    capacity = device.memory_bytes if capacity_bytes is None else capacity_bytes
    solver = SetSolver(workload, device, eff, memory, capacity)
    partitions = [p for p in set_partitions(workload.role_names) if _respects(p, must_share)]
    if workload.rollout_lag:
        partitions = [p for p in partitions if _rollout_apart(p)]
        _check_lag_fits(device, partitions)
    results = [_search_partition(p, solver, device) for p in partitions]
    feasible = sorted((r for r in results if r.best is not None), key=lambda r: r.best.total)
    infeasible = [r for r in results if r.best is None]
    if not feasible:
        reasons = "; ".join(r.reason for r in infeasible[:3])
        raise UserError(f"placement: no placement of {', '.join(workload.role_names)} fits "
                        f"{device.world_size} GPUs of {device.memory_bytes / GIB:.0f} GiB ({reasons}); "
                        "add GPUs (cluster.nodes) or set roles.<role>.offload_optimizer=true")
    stats = {"partitions": len(results), "set_solves": solver.solves,
             "allocations": sum(r.allocations_tried for r in results)}
    best = feasible[0].best
    assert best is not None and math.isfinite(best.total)
    return SearchResult(best, feasible + infeasible, device.world_size, eff, stats)
