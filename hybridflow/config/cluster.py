"""Cluster description: nodes x GPUs, with device figures defaulted from the GPU type."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridflow.config.bounds import bounded
from hybridflow.errors import UserError

# Public datasheet figures (SXM parts). "cpu" is a CPU process standing in for a GPU: its memory is
# the budget we give each such process on a 24 GiB development machine.
GPU_DEFAULTS: dict[str, dict[str, float]] = {
    "A100": dict(gpu_memory_gib=80, bf16_tflops=312, hbm_tbps=2.0, intra_node_gbps=300, inter_node_gbps=25),
    "H100": dict(gpu_memory_gib=80, bf16_tflops=989, hbm_tbps=3.35, intra_node_gbps=450, inter_node_gbps=50),
    "H200": dict(gpu_memory_gib=141, bf16_tflops=989, hbm_tbps=4.8, intra_node_gbps=450, inter_node_gbps=50),
    "cpu": dict(gpu_memory_gib=4, bf16_tflops=0.2, hbm_tbps=0.02, intra_node_gbps=5, inter_node_gbps=1),
}

# What the memory estimate leaves out of each GPU (hybridflow/placement/memory.py), the default of
# `cluster.gpu_memory_headroom_gib`: a fixed part for the CUDA contexts (~0.5-1 GiB per process, and a vLLM
# rank has two: its training rank and its engine process) and NCCL's buffers (~1 GiB with a few
# communicators), plus a share of the card for the caching allocator's fragmentation. H200: 2 + 0.05 x 141
# = 9.05 GiB; H100: 6 GiB. A CPU process has no CUDA context or NCCL: the share only.
HEADROOM_FIXED_GIB = {"A100": 2.0, "H100": 2.0, "H200": 2.0, "cpu": 0.0}
HEADROOM_FRAGMENTATION_SHARE = 0.05


@dataclass
class ClusterConfig:
    """Bandwidths are GB/s (gigabytes) per GPU; `None` fields take the `gpu_type` default (GPU_DEFAULTS)."""

    nodes: int = bounded(1, ge=1)
    gpus_per_node: int = bounded(4, ge=1)
    gpu_type: str = bounded("cpu", choices=tuple(GPU_DEFAULTS))
    gpu_memory_gib: float | None = bounded(None, gt=0)
    nvlink_domain_size: int | None = bounded(None, ge=1)  # GPUs per NVLink domain; None = gpus_per_node
    bf16_tflops: float | None = bounded(None, gt=0)  # dense peak
    hbm_tbps: float | None = bounded(None, gt=0)
    intra_node_gbps: float | None = bounded(None, gt=0)
    inter_node_gbps: float | None = bounded(None, gt=0)
    # GiB of each GPU kept free of the estimate (checks and the auto search); None = HEADROOM_* above.
    gpu_memory_headroom_gib: float | None = bounded(None, ge=0)
    # Host (CPU) memory per node, GiB: offloaded optimizer states, sleeping vLLM weights, checkpoint staging
    # (hybridflow/placement/host_memory.py) must fit in it. None = unknown: estimated and printed, not checked.
    host_memory_gib: float | None = bounded(None, gt=0)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def default_headroom_gib(gpu_type: str, gpu_memory_gib: float) -> float:
    """`cluster.gpu_memory_headroom_gib`'s default for a card of `gpu_memory_gib` (HEADROOM_* above)."""
    return HEADROOM_FIXED_GIB[gpu_type] + HEADROOM_FRAGMENTATION_SHARE * gpu_memory_gib


def resolve_cluster(cluster: ClusterConfig) -> ClusterConfig:
    """Fill `None` device figures from `GPU_DEFAULTS` and check the NVLink domain (ranges: `check_bounds`)."""
    defaults = GPU_DEFAULTS[cluster.gpu_type]
    filled = {k: float(v) for k, v in defaults.items() if getattr(cluster, k) is None}
    if cluster.nvlink_domain_size is None:
        filled["nvlink_domain_size"] = cluster.gpus_per_node
    if cluster.gpu_memory_headroom_gib is None:
        memory = filled.get("gpu_memory_gib", cluster.gpu_memory_gib)
        filled["gpu_memory_headroom_gib"] = default_headroom_gib(cluster.gpu_type, memory)
    cluster = replace(cluster, **filled)
    if cluster.gpu_memory_headroom_gib >= cluster.gpu_memory_gib:
        raise UserError(
            f"cluster.gpu_memory_headroom_gib: {cluster.gpu_memory_headroom_gib:g} leaves nothing of "
            f"gpu_memory_gib={cluster.gpu_memory_gib:g}; set it below the GPU's memory"
        )
    if cluster.gpus_per_node % cluster.nvlink_domain_size:
        raise UserError(
            f"cluster.nvlink_domain_size: {cluster.nvlink_domain_size} does not divide gpus_per_node="
            f"{cluster.gpus_per_node}; use a divisor"
        )
    return cluster
