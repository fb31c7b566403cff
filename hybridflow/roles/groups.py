"""Process groups for every role from the plan (the rollout's mesh is already in generation order)."""

from __future__ import annotations

from megatron.core.process_groups_config import ProcessGroupCollection

from hybridflow.placement import RoleMesh
from megatron_adapters.process_groups import build_role_groups


def build_groups(meshes: dict[str, RoleMesh]) -> dict[str, ProcessGroupCollection | None]:
    """Every role's groups, in one fixed order on every rank (group creation is collective)."""
    return {role: build_role_groups(m.ranks, m.tp, m.pp, m.dp) for role, m in sorted(meshes.items())}
