"""Placement: cluster GPUs, per-role meshes, memory estimates, the explicit planner and the auto search.

Imports only hybridflow.config, hybridflow.engines (the engine records' pure part) and hybridflow.errors
(anything may import this package).
"""

from hybridflow.placement.cluster import GPU, cluster_gpus
from hybridflow.placement.config_plan import plan_placement
from hybridflow.placement.memory import GIB, MemoryEstimate, estimate_role_memory
from hybridflow.placement.mesh import ParallelDims, RoleMesh
from hybridflow.placement.planner import Plan, build_plan, colocation_sets, resolve_resources
from hybridflow.placement.resources import parse_gpu_list

__all__ = [
    "GIB",
    "GPU",
    "MemoryEstimate",
    "ParallelDims",
    "Plan",
    "RoleMesh",
    "build_plan",
    "cluster_gpus",
    "colocation_sets",
    "estimate_role_memory",
    "parse_gpu_list",
    "plan_placement",
    "resolve_resources",
]
