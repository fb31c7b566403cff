"""Cluster description: nodes x GPUs, with device figures defaulted from the GPU type."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridflow.errors import UserError


@dataclass
class ClusterConfig:
    """Bandwidths are GB/s (gigabytes) per GPU; `None` fields take the `gpu_type` default below."""

    nodes: int = 1
    gpus_per_node: int = 4
    gpu_type: str = "cpu"
    gpu_memory_gib: float | None = None
    nvlink_domain_size: int | None = None  # GPUs per NVLink domain; None = gpus_per_node
    bf16_tflops: float | None = None  # dense peak
    hbm_tbps: float | None = None
    intra_node_gbps: float | None = None
    inter_node_gbps: float | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


# Public datasheet figures (SXM parts). "cpu" is a CPU process standing in for a GPU: its memory is
# the budget we give each such process on a 24 GiB development machine.
GPU_DEFAULTS: dict[str, dict[str, float]] = {
    "A100": dict(gpu_memory_gib=80, bf16_tflops=312, hbm_tbps=2.0, intra_node_gbps=300, inter_node_gbps=25),
    "H100": dict(gpu_memory_gib=80, bf16_tflops=989, hbm_tbps=3.35, intra_node_gbps=450, inter_node_gbps=50),
    "H200": dict(gpu_memory_gib=141, bf16_tflops=989, hbm_tbps=4.8, intra_node_gbps=450, inter_node_gbps=50),
    "cpu": dict(gpu_memory_gib=4, bf16_tflops=0.2, hbm_tbps=0.02, intra_node_gbps=5, inter_node_gbps=1),
}


def resolve_cluster(cluster: ClusterConfig) -> ClusterConfig:
    """Fill `None` device figures from `GPU_DEFAULTS` and check the shape."""
    if cluster.gpu_type not in GPU_DEFAULTS:
        raise UserError(
            f"cluster.gpu_type: {cluster.gpu_type!r} is unknown; use one of {', '.join(GPU_DEFAULTS)} "
            "or set every device figure (gpu_memory_gib, bf16_tflops, ...) yourself"
        )
    if cluster.nodes < 1 or cluster.gpus_per_node < 1:
        raise UserError(f"cluster: nodes={cluster.nodes}, gpus_per_node={cluster.gpus_per_node}; both must be >= 1")
    defaults = GPU_DEFAULTS[cluster.gpu_type]
    filled = {k: float(v) for k, v in defaults.items() if getattr(cluster, k) is None}
    if cluster.nvlink_domain_size is None:
        filled["nvlink_domain_size"] = cluster.gpus_per_node
    cluster = replace(cluster, **filled)
    if cluster.gpus_per_node % cluster.nvlink_domain_size:
        raise UserError(
            f"cluster.nvlink_domain_size: {cluster.nvlink_domain_size} does not divide gpus_per_node="
            f"{cluster.gpus_per_node}; use a divisor"
        )
    return cluster
