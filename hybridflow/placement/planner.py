"""Explicit placement: config -> Plan (role meshes on global ranks, rank -> roles, memory per GPU).

`hybridflow.placement.config_plan.plan_placement` picks this or the auto search (which calls `build_plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hybridflow.config.experiment import ExperimentConfig
from hybridflow.errors import UserError
from hybridflow.placement.checks import (
    check_batch_sizes,
    check_colocation,
    check_layout_fits_model,
    check_optimizer_offload,
    check_reference_on_actor,
    check_rollout_engine,
    check_rollout_lag,
    check_tp_groups_local,
    memory_fixes,
)
from hybridflow.placement.cluster import GPU, cluster_gpus
from hybridflow.placement.generation import generation_mesh
from hybridflow.placement.host_memory import HostMemoryEstimate, node_host_memory, writes_dist_checkpoints
from hybridflow.placement.memory import GIB, MemoryEstimate, estimate_role_memory, rollout_shares_actor_weights
from hybridflow.placement.mesh import ParallelDims, RoleMesh
from hybridflow.placement.offload import (
    offload_fractions,
    pick_offload_fraction,
    roles_to_pick,
    with_offload_fraction,
)
from hybridflow.placement.resources import parse_gpu_list
from hybridflow.placement.update_budget import (
    budget_roles_to_pick,
    pick_update_max_tokens,
    update_max_tokens,
    with_update_max_tokens,
)
from hybridflow.role_records import ROLE_RECORDS, Role, role_names


@dataclass
class Plan:
    world_size: int
    nodes: int
    gpus_per_node: int
    gpus: tuple[GPU, ...]  # index = global rank
    meshes: dict[str, RoleMesh]  # enabled roles only, canonical role order; rollout in generation order
    rank_roles: dict[int, tuple[str, ...]]
    colocation_sets: list[tuple[str, ...]]
    memory: dict[int, MemoryEstimate]  # per rank, summed over its roles
    role_memory: dict[int, dict[str, MemoryEstimate]] = field(default_factory=dict)  # per rank, per role
    capacity_bytes: int = 0
    headroom_bytes: int = 0  # kept free of the estimate on every GPU (cluster.gpu_memory_headroom_gib)
    host_memory: dict[int, HostMemoryEstimate] = field(default_factory=dict)  # per node
    host_capacity_bytes: int | None = None  # per node (cluster.host_memory_gib); None: not checked
    offload_fractions: dict[str, float] = field(default_factory=dict)  # role -> optimizer share on the host
    # trained role -> its update micro-batches' token budget (0 = micro_batch_size rows); an unset
    # roles.<role>.update_max_tokens is the planner's pick (update_budget.py), and the ranks build with this one
    update_max_tokens: dict[str, int] = field(default_factory=dict)
    # The engine the rollout runs (rollout.engine=auto resolved: hybridflow.placement.engine_choice); the
    # ranks build this one.
    rollout_engine: str = ""

    @property
    def usable_bytes(self) -> int:
        """What the estimate may fill on one GPU: its capacity less the headroom."""
        return self.capacity_bytes - self.headroom_bytes

    def over_capacity(self) -> list[int]:
        return [r for r, m in self.memory.items() if m.total > self.usable_bytes]

    def host_over_capacity(self) -> list[int]:
        if self.host_capacity_bytes is None:
            return []
        return [n for n, m in self.host_memory.items() if m.total > self.host_capacity_bytes]

    def to_json(self) -> dict:
        return {
            "world_size": self.world_size,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "host_capacity_bytes": self.host_capacity_bytes,
            "host_memory": {str(n): m.to_json() for n, m in self.host_memory.items()},
            "offload_fractions": self.offload_fractions,
            "update_max_tokens": self.update_max_tokens,
            "rollout_engine": self.rollout_engine,
            "gpus": [{"rank": g.rank, "node": g.node, "local_index": g.local_index} for g in self.gpus],
            "meshes": {role: mesh.to_json() for role, mesh in self.meshes.items()},
            "rank_roles": {str(r): list(roles) for r, roles in self.rank_roles.items()},
            "colocation_sets": [list(s) for s in self.colocation_sets],
            "memory": {
                str(r): {
                    "total": m.to_json(),
                    "roles": {k: v.to_json() for k, v in self.role_memory[r].items()},
                }
                for r, m in self.memory.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        """The plan `to_json` wrote, equal to the one that wrote it (what the ranks load from plan.json)."""
        role_memory = {int(r): {role: _estimate(MemoryEstimate, m) for role, m in parts["roles"].items()}
                       for r, parts in data["memory"].items()}
        return cls(
            world_size=data["world_size"],
            nodes=data["nodes"],
            gpus_per_node=data["gpus_per_node"],
            gpus=tuple(GPU(g["rank"], g["node"], g["local_index"]) for g in data["gpus"]),
            meshes={role: RoleMesh.from_json(role, m) for role, m in data["meshes"].items()},
            rank_roles={int(r): tuple(roles) for r, roles in data["rank_roles"].items()},
            colocation_sets=[tuple(s) for s in data["colocation_sets"]],
            memory={int(r): _estimate(MemoryEstimate, parts["total"]) for r, parts in data["memory"].items()},
            role_memory=role_memory,
            capacity_bytes=data["capacity_bytes"],
            headroom_bytes=data["headroom_bytes"],
            host_memory={int(n): _estimate(HostMemoryEstimate, m) for n, m in data["host_memory"].items()},
            host_capacity_bytes=data["host_capacity_bytes"],
            offload_fractions=dict(data["offload_fractions"]),
            update_max_tokens=dict(data["update_max_tokens"]),
            rollout_engine=data["rollout_engine"],
        )


def _estimate[E: (MemoryEstimate, HostMemoryEstimate)](kind: type[E], parts: dict[str, int]) -> E:
    """An estimate from its JSON parts (`total` is derived, not a field)."""
    return kind(**{name: value for name, value in parts.items() if name != "total"})


def resolve_resources(cfg: ExperimentConfig) -> dict[str, tuple[int, ...]]:
    """Enabled role -> ordered global ranks from `placement.resources` (ref defaults to the actor's)."""
    resources = cfg.placement.resources
    for role in resources:
        if role not in ROLE_RECORDS:
            raise UserError(f"placement.resources.{role}: unknown role; use one of {', '.join(role_names())}")
    ranks: dict[str, tuple[int, ...]] = {}
    for role in cfg.roles.enabled_roles():
        if role in resources:
            ranks[role] = parse_gpu_list(resources[role], cfg.cluster, f"placement.resources.{role}")
        elif role == Role.REF and Role.ACTOR in ranks:
            ranks[role] = ranks[Role.ACTOR]
        else:
            raise UserError(
                f"placement.resources.{role}: no GPUs for enabled role {role}; list them "
                f"(e.g. placement.resources.{role}=[all]) or set roles.{role}.enabled=false"
            )
    return ranks


def role_dims(cfg: ExperimentConfig, role: str, n_gpus: int) -> ParallelDims:
    """(tp, pp, dp) of a role on `n_gpus` GPUs; dp=None derives it."""
    par = cfg.roles.get(role).parallel
    tp, pp = par.tp, par.pp
    if par.dp is None:
        if n_gpus % (tp * pp):
            raise UserError(
                f"placement.resources.{role}: {n_gpus} GPUs are not divisible by tp x pp = {tp} x {pp}; "
                f"list a multiple of {tp * pp} GPUs or change roles.{role}.parallel"
            )
        return ParallelDims(tp=tp, pp=pp, dp=n_gpus // (tp * pp))
    if tp * pp * par.dp != n_gpus:
        raise UserError(
            f"roles.{role}.parallel: tp x pp x dp = {tp} x {pp} x {par.dp} = {tp * pp * par.dp} but "
            f"placement.resources.{role} has {n_gpus} GPUs; set roles.{role}.parallel.dp=null to derive it "
            f"or list {tp * pp * par.dp} GPUs"
        )
    return ParallelDims(tp=tp, pp=pp, dp=par.dp)


def build_plan(
    cfg: ExperimentConfig,
    role_ranks: Mapping[str, Sequence[int]],
    dims: Mapping[str, ParallelDims] | None = None,
) -> Plan:
    """Check and assemble a plan from role -> ranks (and optional role -> layout, else from config).

    The auto planner calls this with its chosen ranks and layouts, so every plan passes the same checks.
    """
    check_rollout_engine(cfg)
    check_optimizer_offload(cfg)
    gpus = cluster_gpus(cfg.cluster)
    ranks = {r: tuple(role_ranks[r]) for r in role_names() if r in role_ranks}
    check_colocation(cfg, ranks)
    meshes: dict[str, RoleMesh] = {}
    for role, role_rank_list in ranks.items():
        if dims is not None and role in dims:
            d = dims[role]
        else:
            par = cfg.roles.get(role).parallel
            check_layout_fits_model(cfg, role, ParallelDims(tp=par.tp, pp=par.pp, dp=1))  # name tp/pp errors first
            d = role_dims(cfg, role, len(role_rank_list))
        check_layout_fits_model(cfg, role, d)
        check_batch_sizes(cfg, role, d)
        mesh = RoleMesh(role=role, ranks=role_rank_list, dims=ParallelDims(d.tp, d.pp, d.dp))
        if role == Role.ROLLOUT and Role.ACTOR in meshes:  # role order: the actor's mesh exists by now
            mesh = generation_mesh(meshes[Role.ACTOR], mesh)  # the order the run builds its TP groups in
        check_tp_groups_local(mesh, gpus, cfg)
        meshes[role] = mesh
    check_reference_on_actor(cfg, meshes)
    rank_roles = {g.rank: tuple(r for r in meshes if g.rank in meshes[r].ranks) for g in gpus}
    capacity, headroom = int(cfg.cluster.gpu_memory_gib * GIB), int(cfg.cluster.gpu_memory_headroom_gib * GIB)
    def gpu_totals(c: ExperimentConfig) -> dict[int, int]:
        return {r: sum(m.total for m in parts.values()) for r, parts in _memory_by_rank(c, meshes, gpus).items()}

    # The offload share first, at unset budgets (micro_batch_size rows); then the budget grows at that share.
    to_pick = roles_to_pick(cfg, tuple(meshes))
    if to_pick:
        cfg = with_offload_fraction(cfg, to_pick, pick_offload_fraction(cfg, to_pick, gpu_totals, capacity - headroom))
    to_size = budget_roles_to_pick(cfg, tuple(meshes))
    if to_size:
        tokens = pick_update_max_tokens(cfg, to_size, meshes, gpu_totals, capacity - headroom)
        cfg = with_update_max_tokens(cfg, to_size, tokens)
    role_memory = _memory_by_rank(cfg, meshes, gpus)
    memory = {rank: sum(parts.values(), MemoryEstimate()) for rank, parts in role_memory.items()}
    check_rollout_lag(cfg, meshes)
    plan = Plan(
        world_size=len(gpus),
        nodes=cfg.cluster.nodes,
        gpus_per_node=cfg.cluster.gpus_per_node,
        gpus=gpus,
        meshes=meshes,
        rank_roles=rank_roles,
        colocation_sets=colocation_sets(meshes),
        memory=memory,
        role_memory=role_memory,
        capacity_bytes=capacity,
        headroom_bytes=headroom,
        host_memory=node_host_memory(cfg, meshes, gpus),
        host_capacity_bytes=None if cfg.cluster.host_memory_gib is None else int(cfg.cluster.host_memory_gib * GIB),
        offload_fractions=offload_fractions(cfg, tuple(meshes)),
        update_max_tokens=update_max_tokens(cfg, tuple(meshes)),
        rollout_engine=cfg.rollout.engine,
    )
    if cfg.placement.check_memory:
        check_memory(plan, cfg)
        check_host_memory(plan, writes_checkpoints=writes_dist_checkpoints(cfg))
    return plan


def _memory_by_rank(
    cfg: ExperimentConfig, meshes: dict[str, RoleMesh], gpus: tuple[GPU, ...]
) -> dict[int, dict[str, MemoryEstimate]]:
    actor, rollout = meshes.get(Role.ACTOR), meshes.get(Role.ROLLOUT)
    shares = (actor is not None and rollout is not None and rollout_shares_actor_weights(
        cfg, set(actor.ranks) == set(rollout.ranks), actor.tp, actor.pp, rollout.tp))
    out: dict[int, dict[str, MemoryEstimate]] = {g.rank: {} for g in gpus}
    for role, mesh in meshes.items():
        model = cfg.role_model(role)
        per_stage = [
            estimate_role_memory(model, role, mesh.dims, cfg, stage=s,
                                 shares_actor_weights=shares and role == Role.ROLLOUT)
            for s in range(mesh.pp)
        ]
        for rank in mesh.ranks:
            out[rank][role] = per_stage[mesh.coords(rank)[2]]
    return out


def colocation_sets(meshes: Mapping[str, RoleMesh]) -> list[tuple[str, ...]]:
    """Groups of roles that share GPUs (connected by any overlap), ordered by their first GPU."""
    sets: list[tuple[set[str], set[int]]] = []
    for role, mesh in meshes.items():
        merged_roles, merged_ranks = {role}, set(mesh.ranks)
        for s in [s for s in sets if s[1] & merged_ranks]:
            sets.remove(s)
            merged_roles |= s[0]
            merged_ranks |= s[1]
        sets.append((merged_roles, merged_ranks))
    sets.sort(key=lambda s: min(s[1]))
    return [tuple(r for r in role_names() if r in roles) for roles, _ in sets]


def check_memory(plan: Plan, cfg: ExperimentConfig) -> None:
    """Fail on the first GPU whose estimate exceeds its capacity less the headroom, with the numbers and the
    fixes that would help there (`cfg`: the resolved config the plan was built from)."""
    for rank in plan.over_capacity():
        parts = " + ".join(f"{role} {m.total / GIB:.1f}" for role, m in plan.role_memory[rank].items())
        fixes = memory_fixes(cfg, tuple(plan.role_memory[rank]), plan.offload_fractions, plan.update_max_tokens)
        raise UserError(
            f"cluster.gpu_memory_gib: GPU {rank} (node {plan.gpus[rank].node}) needs an estimated "
            f"{plan.memory[rank].total / GIB:.1f} GiB ({parts}) > {plan.usable_bytes / GIB:.1f} GiB "
            f"({plan.capacity_bytes / GIB:.1f} GiB capacity - {plan.headroom_bytes / GIB:.1f} GiB "
            f"cluster.gpu_memory_headroom_gib); {', '.join(fixes)} (placement.check_memory=false to skip)"
        )


def check_host_memory(plan: Plan, writes_checkpoints: bool) -> None:
    """Fail on the first node whose host-memory estimate exceeds cluster.host_memory_gib, with the numbers;
    `writes_checkpoints`: the run saves dist checkpoints (whose staging the fix can then name)."""
    for node in plan.host_over_capacity():
        mem = plan.host_memory[node]
        parts = " + ".join(f"{k} {v / GIB:.1f}" for k, v in mem.to_json().items() if k != "total" and v)
        fix = "lower roles.<role>.offload_fraction, raise dp (shards the offloaded states) or add nodes"
        if plan.offload_fractions and mem.optimizer:
            fraction = max(plan.offload_fractions.values())
            over = mem.total - plan.host_capacity_bytes
            fits = fraction * (1 - over / mem.optimizer)
            fix = (f"roles.<role>.offload_fraction is {fraction:g}; the host holds at most "
                   f"{max(fits, 0.0):.2f} of it: lower it (more optimizer on the GPU), raise dp or add nodes")
        if writes_checkpoints:
            fix += (f", or set trainer.save_last=false and trainer.save_every=0 (no checkpoint: the run cannot "
                    f"resume; staging one takes up to {mem.checkpoint / GIB:.1f} GiB)")
        raise UserError(
            f"cluster.host_memory_gib: node {node} needs an estimated {mem.total / GIB:.1f} GiB of host memory "
            f"({parts}) > {plan.host_capacity_bytes / GIB:.1f} GiB; {fix} (placement.check_memory=false to skip)"
        )
