"""The static reshard plan: which rank plays which generation role and where its shards come from.

Computed once from the two layouts (no communication): training ``(TP_t, PP_t, DP_t)`` over the actor's
ranks and generation ``(TP_g, DP_g)`` over the rollout's ranks (no pipeline in generation).

Colocated placement (actor and rollout on the same ranks) follows HybridFlow's zero-redundancy grouping
(Sheng et al., EuroSys'25, section 5, "3D-HybridEngine"):

- ``TP_g <= TP_t``: inside each training replica (one DP index: ``TP_t * PP_t`` ranks), a *micro-DP group*
  is the ``d_g = TP_t * PP_t / TP_g`` ranks whose TP index lies in block ``k`` of ``s = TP_t / TP_g``
  consecutive TP indices, across all pipeline stages. Together their shards are exactly generation TP shard
  ``k`` of the whole model, so one all-gather inside the group gives every member its generation shard,
  which contains the member's own training shard: nothing is sent twice and nothing is sent to a rank that
  holds it. Generation TP groups take one rank per micro-DP group, i.e. training TP ranks at stride ``s``.
  Bytes received per rank: ``(d_g - 1) / (TP_t * PP_t) * M`` on average (M = one replica's shard bytes).
- ``TP_g > TP_t``: every generation shard lies inside one training shard; ``TP_g / TP_t`` training replicas
  form one generation TP group and each rank slices locally (with PP_t > 1 a rank also needs the other
  stages' layers: those slices, and only those, come point-to-point from the same replica).

Split placement (disjoint ranks): rollout rank ``i`` is generation TP rank ``i % TP_g`` of generation
replica ``i // TP_g``, fed by training replica ``(i // TP_g) % DP_t``; each source sends exactly the rows the
receiver needs, point to point.

Why not ``megatron.core.resharding.build_centralized_reshard_plan``: it plans Megatron -> Megatron refits
between two *instantiated* modules matched by identical parameter names with plain LCM slicing per TP
dimension, gathers metadata with object collectives and reads megatron's global ``parallel_state``. It has no
notion of vLLM's fused/renamed tensors or of a differently padded vocabulary, and its receivers pull slices
point to point rather than via HybridFlow's per-group all-gather. Its copy-service interface does fit and is
used by ``transport.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.errors import UserError
from hybridflow.placement.mesh import RoleMesh


@dataclass(frozen=True)
class TrainingLayout:
    """The actor's mesh; rank order tp fastest, then dp, then pp (megatron's / RoleMesh's order)."""

    ranks: tuple[int, ...]
    tp: int
    pp: int
    dp: int

    def __post_init__(self) -> None:
        if self.tp * self.pp * self.dp != len(self.ranks) or min(self.tp, self.pp, self.dp) < 1:
            raise ValueError(
                f"actor parallel: tp*pp*dp = {self.tp}*{self.pp}*{self.dp} must equal its {len(self.ranks)} ranks"
            )

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp_rank, dp_rank, pp_rank) of a global rank."""
        i = self.ranks.index(rank)
        return i % self.tp, (i // self.tp) % self.dp, i // (self.tp * self.dp)

    def rank_at(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        """Global rank at these coordinates."""
        return self.ranks[tp_rank + self.tp * (dp_rank + self.dp * pp_rank)]


@dataclass(frozen=True)
class GenerationLayout:
    """The rollout's ranks and tensor-parallel size (DP_g = ranks / TP_g; no pipeline)."""

    ranks: tuple[int, ...]
    tp: int

    def __post_init__(self) -> None:
        if self.tp < 1 or len(self.ranks) % self.tp:
            raise ValueError(f"rollout parallel: tp={self.tp} must divide its {len(self.ranks)} ranks")

    @property
    def dp(self) -> int:
        return len(self.ranks) // self.tp


@dataclass(frozen=True)
class GenerationRank:
    """One rollout rank's generation coordinates and where its weights come from."""

    rank: int
    tp_rank: int
    dp_rank: int
    replica: int  # the training DP replica whose shards fill this rank
    gather_group: tuple[int, ...]  # micro-DP group (all-gather), () where nothing is gathered


@dataclass(frozen=True)
class ReshardPlan:
    """Static mapping from the training layout to the generation layout (see module docstring)."""

    train: TrainingLayout
    gen: GenerationLayout
    colocated: bool
    slots: dict[int, GenerationRank]

    @property
    def micro_dp_size(self) -> int:
        """d_g: ranks per all-gather group (1 where nothing is gathered)."""
        return max(len(s.gather_group) for s in self.slots.values()) or 1

    def generation_tp_groups(self) -> list[tuple[int, ...]]:
        """Generation TP groups (ordered by generation TP rank), one per generation DP rank."""
        groups: dict[int, dict[int, int]] = {}
        for s in self.slots.values():
            groups.setdefault(s.dp_rank, {})[s.tp_rank] = s.rank
        return [tuple(g[t] for t in sorted(g)) for _, g in sorted(groups.items())]

    def generation_rank_order(self) -> tuple[int, ...]:
        """Rollout ranks ordered generation-TP fastest: consecutive chunks of TP_g are TP groups.

        The rollout engine must build its TP groups from this order (a RoleMesh with these ranks).
        """
        return tuple(r for group in self.generation_tp_groups() for r in group)

    def micro_dp_groups(self) -> list[tuple[int, ...]]:
        """The distinct all-gather groups (empty where nothing is gathered)."""
        return sorted({s.gather_group for s in self.slots.values() if len(s.gather_group) > 1})

    def source_rank(self, slot: GenerationRank, piece: int, stage: int) -> int:
        """The training rank holding TP shard ``piece`` of pipeline stage ``stage`` for this slot."""
        return self.train.rank_at(piece, slot.replica, stage)


def build_reshard_plan(train: TrainingLayout, gen: GenerationLayout) -> ReshardPlan:
    """Build the plan; raises ValueError naming the setting to change when the layouts cannot pair."""
    same, disjoint = set(train.ranks) == set(gen.ranks), not set(train.ranks) & set(gen.ranks)
    if not (same or disjoint):
        raise ValueError(
            "placement.resources.rollout: must list exactly the actor's GPUs (colocated) or none of them (split)"
        )
    if same:
        slots = _colocated_slots(train, gen)
    else:
        slots = {
            rank: GenerationRank(rank, i % gen.tp, i // gen.tp, (i // gen.tp) % train.dp, ())
            for i, rank in enumerate(gen.ranks)
        }
    return ReshardPlan(train=train, gen=gen, colocated=same, slots=slots)


def _colocated_slots(train: TrainingLayout, gen: GenerationLayout) -> dict[int, GenerationRank]:
    t, p, tg = train.tp, train.pp, gen.tp
    slots = {}
    if tg <= t:
        if t % tg:
            raise ValueError(f"roles.rollout.parallel.tp: {tg} must divide the actor's tp={t} (or be a multiple)")
        s = t // tg
        for rank in train.ranks:
            tp, dp, pp = train.coords(rank)
            k = tp // s
            group = tuple(train.rank_at(k * s + m, dp, q) for q in range(p) for m in range(s))
            position = pp * s + tp % s
            slots[rank] = GenerationRank(rank, k, dp * s * p + position, dp, group if len(group) > 1 else ())
        return slots
    if tg % t or train.dp % (tg // t):
        raise ValueError(
            f"roles.rollout.parallel.tp: {tg} must be a multiple of the actor's tp={t} "
            f"with (tp_g/tp_t) dividing "
            f"the actor's dp={train.dp}; choose tp_g in {{tp_t * k : k divides dp}}"
        )
    s = tg // t
    for rank in train.ranks:
        tp, dp, pp = train.coords(rank)
        slots[rank] = GenerationRank(rank, tp * s + dp % s, (dp // s) * p + pp, dp, ())
    return slots


def hybridflow_optimal_bytes(plan: ReshardPlan, replica_bytes: int) -> float:
    """HybridFlow's per-rank communication (d_g - 1) / (TP_t * PP_t) * M for colocated TP_g <= TP_t.

    ``replica_bytes`` is M: the bytes of one training replica's shards (all TP x PP ranks). Colocated
    TP_g >= TP_t with PP_t = 1 moves nothing (each rank slices its own shard).
    """
    t, p = plan.train.tp, plan.train.pp
    if not plan.colocated:
        raise ValueError("bridge: the HybridFlow optimum is defined for colocated placement only")
    if plan.gen.tp > t:
        return 0.0 if p == 1 else float("nan")
    d_g = t * p // plan.gen.tp
    return (d_g - 1) / (t * p) * replica_bytes


def generation_mesh(actor: RoleMesh, rollout: RoleMesh) -> tuple[ReshardPlan, RoleMesh]:
    """The static reshard plan and the rollout mesh whose TP groups are the plan's generation TP groups.

    HybridFlow's zero-redundancy grouping takes generation TP groups at a stride over the actor's ranks, so
    the rollout's rank order comes from this plan, not from the placement's listing. The planner stores the
    result in `Plan.meshes["rollout"]`; every later reader (plan.json, the printout, the run) uses that mesh.
    """
    try:
        plan = build_reshard_plan(
            TrainingLayout(actor.ranks, actor.tp, actor.pp, actor.dp), GenerationLayout(rollout.ranks, rollout.tp)
        )
    except ValueError as err:
        raise UserError(str(err)) from None
    order = plan.generation_rank_order()
    return plan, RoleMesh("rollout", order, rollout.tp, 1, len(order) // rollout.tp)
