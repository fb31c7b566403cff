"""The rollout's generation mesh: which rollout ranks form which generation TP group (a placement fact).

Computed once from the two layouts (no communication): training ``(TP_t, PP_t, DP_t)`` over the actor's
ranks and generation ``(TP_g, DP_g)`` over the rollout's ranks (no pipeline in generation). The bridge
(`megatron_adapters/bridge/plan.py`) reads the same coordinates to decide where each generation rank's
weights come from.

Colocated placement (actor and rollout on the same ranks) follows HybridFlow's zero-redundancy grouping
(Sheng et al., EuroSys'25, section 5, "3D-HybridEngine"):

- ``TP_g <= TP_t``: inside each training replica (one DP index: ``TP_t * PP_t`` ranks), the ranks whose TP
  index lies in block ``k`` of ``s = TP_t / TP_g`` consecutive TP indices, across all pipeline stages, hold
  generation TP shard ``k`` between them (a *micro-DP group*, ``d_g = TP_t * PP_t / TP_g`` ranks). Each of
  them is generation TP rank ``k``; generation TP groups take one rank per micro-DP group, i.e. training TP
  ranks at stride ``s``.
- ``TP_g > TP_t``: every generation shard lies inside one training shard; ``TP_g / TP_t`` training replicas
  form one generation TP group, generation TP rank ``tp_t * (TP_g / TP_t) + dp_t % (TP_g / TP_t)``.

Split placement (disjoint ranks): rollout rank ``i`` of the listing is generation TP rank ``i % TP_g`` of
generation replica ``i // TP_g``.
"""

from __future__ import annotations

from hybridflow.errors import UserError
from hybridflow.placement.mesh import ParallelDims, RoleMesh
from hybridflow.role_records import Role


def generation_coords(actor: RoleMesh, rollout: RoleMesh) -> dict[int, tuple[int, int]]:
    """Rollout rank -> (generation TP rank, generation DP rank); ValueError naming the setting to change when
    the layouts cannot pair. Colocated coordinates follow the actor's mesh, so any rollout listing gives the
    same ones; split ones follow the rollout's listing (the generation mesh lists them in that order)."""
    same, disjoint = set(actor.ranks) == set(rollout.ranks), not set(actor.ranks) & set(rollout.ranks)
    if not (same or disjoint):
        raise ValueError(
            "placement.resources.rollout: must list exactly the actor's GPUs (colocated) or none of them (split)"
        )
    tg = rollout.tp
    if disjoint:
        return {rank: (i % tg, i // tg) for i, rank in enumerate(rollout.ranks)}
    t, p = actor.tp, actor.pp
    coords = {}
    if tg <= t:
        if t % tg:
            raise ValueError(f"roles.rollout.parallel.tp: {tg} must divide the actor's tp={t} (or be a multiple)")
        s = t // tg
        for rank in actor.ranks:
            tp, dp, pp = actor.coords(rank)
            coords[rank] = (tp // s, dp * s * p + pp * s + tp % s)
        return coords
    if tg % t or actor.dp % (tg // t):
        raise ValueError(
            f"roles.rollout.parallel.tp: {tg} must be a multiple of the actor's tp={t} "
            f"with (tp_g/tp_t) dividing "
            f"the actor's dp={actor.dp}; choose tp_g in {{tp_t * k : k divides dp}}"
        )
    s = tg // t
    for rank in actor.ranks:
        tp, dp, pp = actor.coords(rank)
        coords[rank] = (tp * s + dp % s, (dp // s) * p + pp)
    return coords


def generation_mesh(actor: RoleMesh, rollout: RoleMesh) -> RoleMesh:
    """The rollout mesh whose TP groups are the generation TP groups: ranks ordered generation-TP fastest.

    HybridFlow's zero-redundancy grouping takes generation TP groups at a stride over the actor's ranks, so
    the rollout's rank order comes from here, not from the placement's listing. The planner stores the result
    in `Plan.meshes["rollout"]`; every later reader (plan.json, the printout, the run, the bridge) uses it.
    """
    try:
        coords = generation_coords(actor, rollout)
    except ValueError as err:
        raise UserError(str(err)) from None
    order = tuple(sorted(coords, key=lambda rank: coords[rank][::-1]))  # by (dp_rank, tp_rank)
    return RoleMesh(Role.ROLLOUT, order, ParallelDims(rollout.tp, 1, len(order) // rollout.tp))
