"""HybridFlow (EuroSys'25) Algorithm 1: search colocation sets, GPU allocations and per-role strategies.

for each partition of the roles into colocation sets:
    minimum GPUs per set = the smallest size at which the set's roles fit memory together
    for each allocation of all the cluster's GPUs to the sets (each at least its minimum):
        per set, per role, the best (TP, PP, DP[, rollout TP]) that fits    (cached per set and size)
        stage time = sum over a set's roles active in the stage, max over sets (sets run in parallel)
        iteration time = sum of stage times
Keeps the best plan of every partition, so the explanation can say why each alternative lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridflow.errors import UserError
from hybridflow.placement.auto.device import DeviceSpec, Efficiency
from hybridflow.placement.auto.partitions import allocations, rank_ranges, set_partitions, set_sizes
from hybridflow.placement.auto.set_solver import MemoryFn, SetSolution, SetSolver
from hybridflow.placement.auto.workload import STAGES, Workload


@dataclass(frozen=True)
class Candidate:
    """One complete placement: sets with their GPU ranges and strategies, and its predicted times."""

    sets: tuple[SetSolution, ...]
    ranks: tuple[range, ...]
    stage_times: dict[str, float]

    @property
    def total(self) -> float:
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


def _candidate(sets: tuple[SetSolution, ...], sizes: tuple[int, ...], gpus_per_node: int) -> Candidate:
    times = {stage: max(s.stage_time(stage) for s in sets) for stage in STAGES}
    return Candidate(sets, tuple(rank_ranges(sizes, gpus_per_node)), times)


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
        cand = _candidate(sets, alloc, gpn)
        if result.best is None or cand.total < result.best.total:
            result.best = cand
    if result.best is None:
        result.reason = "no allocation of the cluster's GPUs gives every set a size with a valid strategy"
    return result


def _respects(partition: tuple[tuple[str, ...], ...], must_share: tuple[tuple[str, ...], ...]) -> bool:
    """Every required group (restricted to roles of the workload) lies inside one set."""
    for group in must_share:
        present = {r for r in group if any(r in s for s in partition)}
        if present and not any(present <= set(s) for s in partition):
            return False
    return True


def search(workload: Workload, device: DeviceSpec, memory: MemoryFn, eff: Efficiency | None = None,
           capacity_bytes: float | None = None,
           must_share: tuple[tuple[str, ...], ...] = ()) -> SearchResult:
    """Run Algorithm 1 and return the fastest placement with every partition's best for comparison.

    `memory(role, strategy)` is the memory estimator (bytes per GPU); the search never returns a plan whose
    colocated roles add up to more than `capacity_bytes` (default: the GPU's memory). `must_share` lists
    role groups the user requires colocated (placement.colocate). Deterministic: enumeration orders are
    fixed and ties keep the earlier candidate (the colocated partition comes first).
    """
    eff = eff or Efficiency()
    capacity = device.memory_bytes if capacity_bytes is None else capacity_bytes
    solver = SetSolver(workload, device, eff, memory, capacity)
    partitions = [p for p in set_partitions(workload.role_names) if _respects(p, must_share)]
    results = [_search_partition(p, solver, device) for p in partitions]
    feasible = sorted((r for r in results if r.best is not None), key=lambda r: r.best.total)
    infeasible = [r for r in results if r.best is None]
    if not feasible:
        reasons = "; ".join(r.reason for r in infeasible[:3])
        raise UserError(f"placement: no placement of {', '.join(workload.role_names)} fits "
                        f"{device.world_size} GPUs of {device.memory_bytes / 2**30:.0f} GiB ({reasons}); "
                        "add GPUs (cluster.nodes) or set roles.<role>.offload_optimizer=true")
    stats = {"partitions": len(results), "set_solves": solver.solves,
             "allocations": sum(r.allocations_tried for r in results)}
    best = feasible[0].best
    assert best is not None and math.isfinite(best.total)
    return SearchResult(best, feasible + infeasible, device.world_size, eff, stats)
