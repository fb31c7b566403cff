"""Process groups for every role from the plan, and the rollout's mesh in the bridge's generation order."""

from __future__ import annotations

from megatron.core.process_groups_config import ProcessGroupCollection

from hybridflow.placement import RoleMesh
from megatron_adapters.bridge import GenerationLayout, ReshardPlan, TrainingLayout, build_reshard_plan
from megatron_adapters.process_groups import build_role_groups


def generation_mesh(actor: RoleMesh, rollout: RoleMesh) -> tuple[ReshardPlan, RoleMesh]:
    """The static reshard plan and the rollout mesh whose TP groups are the plan's generation TP groups.

    HybridFlow's zero-redundancy grouping takes generation TP groups at a stride over the actor's ranks, so
    the rollout's rank order comes from the plan, not from the placement's listing.
    """
    plan = build_reshard_plan(
        TrainingLayout(actor.ranks, actor.tp, actor.pp, actor.dp), GenerationLayout(rollout.ranks, rollout.tp)
    )
    order = plan.generation_rank_order()
    return plan, RoleMesh("rollout", order, rollout.tp, 1, len(order) // rollout.tp)


def build_groups(meshes: dict[str, RoleMesh]) -> dict[str, ProcessGroupCollection | None]:
    """Every role's groups, in one fixed order on every rank (group creation is collective)."""
    return {role: build_role_groups(m.ranks, m.tp, m.pp, m.dp) for role, m in sorted(meshes.items())}
