"""The static reshard plan: where each generation rank's weights come from (who sends which shards to whom).

Built from the Plan's two meshes (no communication): the actor's training mesh ``(TP_t, PP_t, DP_t)`` and
the rollout's generation mesh ``(TP_g, DP_g)``, whose coordinates (which rank is which generation TP rank)
are placement's (`hybridflow/placement/generation.py`, HybridFlow's zero-redundancy grouping). This module
adds the sources:

- colocated, ``TP_g <= TP_t``: a generation rank's *micro-DP group* is the ``d_g = TP_t * PP_t / TP_g`` ranks
  of its training replica whose TP index lies in its block of ``s = TP_t / TP_g`` consecutive TP indices,
  across all pipeline stages. Together their shards are exactly its generation TP shard, so one all-gather
  inside the group gives every member its generation shard, which contains the member's own training shard:
  nothing is sent twice and nothing is sent to a rank that holds it. Bytes received per rank:
  ``(d_g - 1) / (TP_t * PP_t) * M`` on average (M = one replica's shard bytes).
- colocated, ``TP_g > TP_t``: every generation shard lies inside the rank's own training shard; it slices
  locally (with PP_t > 1 the other stages' layers, and only those, come point-to-point from its replica).
- split (disjoint ranks): generation replica ``j`` is fed by training replica ``j % DP_t``; each source sends
  exactly the rows the receiver needs, point to point.

Why not ``megatron.core.resharding.build_centralized_reshard_plan``: it plans Megatron -> Megatron refits
between two *instantiated* modules matched by identical parameter names with plain LCM slicing per TP
dimension, gathers metadata with object collectives and reads megatron's global ``parallel_state``. It has no
notion of vLLM's fused/renamed tensors or of a differently padded vocabulary, and its receivers pull slices
point to point rather than via HybridFlow's per-group all-gather. Its copy-service interface does fit and is
used by ``transport.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.placement.generation import generation_coords
from hybridflow.placement.mesh import RoleMesh


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
    """Static mapping from the training mesh to the generation mesh (see module docstring)."""

    train: RoleMesh
    gen: RoleMesh
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

    def micro_dp_groups(self) -> list[tuple[int, ...]]:
        """The distinct all-gather groups (empty where nothing is gathered)."""
        return sorted({s.gather_group for s in self.slots.values() if len(s.gather_group) > 1})

    def source_rank(self, slot: GenerationRank, piece: int, stage: int) -> int:
        """The training rank holding TP shard ``piece`` of pipeline stage ``stage`` for this slot."""
        return self.train.rank_at(piece, slot.replica, stage)


def build_reshard_plan(actor: RoleMesh, rollout: RoleMesh) -> ReshardPlan:
    """The plan for these meshes (in a run: the Plan's, rollout in generation order); raises ValueError
    naming the setting to change when the layouts cannot pair."""
    if rollout.pp != 1:
        raise ValueError(f"roles.rollout.parallel.pp: generation has no pipeline; {rollout.pp} must be 1")
    coords = generation_coords(actor, rollout)
    colocated = set(actor.ranks) == set(rollout.ranks)
    s = actor.tp // rollout.tp  # block of training TP indices per generation shard (colocated TP_g <= TP_t)
    slots = {}
    for rank, (tp_rank, dp_rank) in coords.items():
        if not colocated:
            slots[rank] = GenerationRank(rank, tp_rank, dp_rank, dp_rank % actor.dp, ())
            continue
        tp, dp, _ = actor.coords(rank)
        group: tuple[int, ...] = ()
        if rollout.tp <= actor.tp and s * actor.pp > 1:
            group = tuple(actor.rank_at(tp_rank * s + m, dp, q) for q in range(actor.pp) for m in range(s))
        slots[rank] = GenerationRank(rank, tp_rank, dp_rank, dp, group)
    return ReshardPlan(train=actor, gen=rollout, colocated=colocated, slots=slots)


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
