"""The cluster as a list of GPUs: global rank = node * gpus_per_node + local index."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.cluster import ClusterConfig


@dataclass(frozen=True)
class GPU:
    rank: int
    node: int
    local_index: int


def cluster_gpus(cluster: ClusterConfig) -> tuple[GPU, ...]:
    """Every GPU of the cluster, indexed by global rank (node-major, like torchrun/Slurm rank order)."""
    return tuple(
        GPU(rank=node * cluster.gpus_per_node + local, node=node, local_index=local)
        for node in range(cluster.nodes)
        for local in range(cluster.gpus_per_node)
    )


def nvlink_domain(gpu: GPU, cluster: ClusterConfig) -> tuple[int, int]:
    """(node, domain) of a GPU: TP groups must stay inside one of these."""
    domain_size = cluster.nvlink_domain_size or cluster.gpus_per_node
    return gpu.node, gpu.local_index // domain_size
