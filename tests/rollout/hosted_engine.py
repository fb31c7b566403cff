"""Tests start an engine process with nothing to overlap it with: spawn it and build its engine at once (the
runtime spawns early and builds after the models, hybridflow.rollout.engine_host)."""

from __future__ import annotations

import torch

from hybridflow.placement import RoleMesh
from hybridflow.rollout.engine_host import EngineBuilder, HostedEngine, build_hosted_engine, spawn_engine_process


def start_hosted_engine(build: EngineBuilder, args: tuple, mesh: RoleMesh, bucket_shapes, dtype: torch.dtype,
                        device: torch.device, timeout_s: float = 1800.0) -> HostedEngine | None:
    """Spawn this rank's engine process and build its engine at once (no model build to overlap with)."""
    return build_hosted_engine(spawn_engine_process(mesh, device, timeout_s=timeout_s), build, args,
                               bucket_shapes, dtype)
