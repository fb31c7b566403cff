"""Process groups for every role from the plan (the rollout's mesh is already in generation order)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from megatron.core.process_groups_config import ProcessGroupCollection

from hybridflow.placement import RoleMesh
from hybridflow.role_records import role_record
from megatron_adapters.group_pool import shared_group
from megatron_adapters.process_groups import build_role_groups


def build_groups(meshes: dict[str, RoleMesh]) -> dict[str, ProcessGroupCollection | None]:
    """Every role's groups, in one fixed order on every rank (group creation is collective)."""
    return {role: build_role_groups(m.ranks, m.tp, m.pp, m.dp) for role, m in sorted(meshes.items())}


@dataclass(frozen=True)
class TrainingGroup:
    """The ranks that hold a model role (actor, critic, ref, reward): the ones that train on a generated batch.

    A rank that holds only the rollout is outside it, so the training stages' exchanges never wait for
    generation there (hybridflow.trainer.rl_trainer explains why that matters at trainer.rollout_lag=1).
    """

    ranks: tuple[int, ...]
    group: dist.ProcessGroup | None  # None: every rank trains (the world group)

    @property
    def member(self) -> bool:
        return dist.get_rank() in self.ranks


def build_training_group(meshes: dict[str, RoleMesh]) -> TrainingGroup:
    """Collective over the world (every rank creates the same group, or none when it would be the world)."""
    ranks = tuple(sorted({r for role, m in meshes.items() if role_record(role).holds_model for r in m.ranks}))
    if len(ranks) == dist.get_world_size():
        return TrainingGroup(ranks, None)
    return TrainingGroup(ranks, shared_group(ranks))
