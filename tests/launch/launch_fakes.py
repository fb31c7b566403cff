"""Minimal stand-ins for hybridflow.placement's Plan/GPU (only the fields the launcher reads)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FakeGPU:
    rank: int
    node: int
    local_index: int


@dataclass
class FakePlan:
    nodes: int
    gpus_per_node: int
    gpus: tuple[FakeGPU, ...] = field(default=())

    @property
    def world_size(self) -> int:
        return len(self.gpus)


def fake_plan(nodes: int, gpus_per_node: int) -> FakePlan:
    gpus = tuple(FakeGPU(r, r // gpus_per_node, r % gpus_per_node) for r in range(nodes * gpus_per_node))
    return FakePlan(nodes=nodes, gpus_per_node=gpus_per_node, gpus=gpus)
