"""Communication times of the collectives one role issues, over NVLink inside a node and the network between.

Volumes follow the ring algorithm (each member sends 2(n-1)/n of the buffer in an all-reduce) and HybridFlow
(EuroSys'25) Table 2 for the training -> generation weight transition. Ranks are laid out the way `RoleMesh`
orders them (tp fastest, then dp, then pp) on consecutive GPUs of node-aligned sets, so a group's span in
GPUs decides whether it leaves the node.
"""

from __future__ import annotations

from hybridflow.placement.auto.device import DeviceSpec, Efficiency


def _intra(device: DeviceSpec, eff: Efficiency) -> float:
    return device.intra_bytes_per_s * eff.nvlink_efficiency


def allreduce_time(nbytes: float, members: int, stride: int, device: DeviceSpec, eff: Efficiency) -> float:
    """One all-reduce of `nbytes` per member over `members` ranks spaced `stride` GPUs apart.

    Inside a node the ring runs at NVLink speed. Across nodes the ring crosses each node boundary once per
    ring; the `per_node` members of a ring that share a node share that crossing, which NCCL spreads over the
    node's NICs, so the network leg carries 2(n-1)/n * nbytes / per_node per GPU.
    """
    if members <= 1 or nbytes <= 0:
        return 0.0
    volume = 2 * (members - 1) / members * nbytes
    span = members * stride
    if span <= device.gpus_per_node:
        return volume / _intra(device, eff) + 2 * (members - 1) * eff.nvlink_latency_s
    per_node = max(1, device.gpus_per_node // stride)
    network = volume / per_node / (device.inter_bytes_per_s * eff.network_efficiency)
    nvlink = volume / _intra(device, eff)
    return max(network, nvlink) + 2 * (members - 1) * eff.network_latency_s


def tp_allreduce_time(nbytes: float, tp: int, device: DeviceSpec, eff: Efficiency) -> float:
    """An activation all-reduce inside one TP group (always inside an NVLink domain)."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * nbytes / _intra(device, eff) + eff.nvlink_latency_s


def p2p_time(nbytes: float, crosses_node: bool, device: DeviceSpec, eff: Efficiency) -> float:
    """One pipeline send of `nbytes` between neighbouring stages."""
    if crosses_node:
        return nbytes / (device.inter_bytes_per_s * eff.network_efficiency) + eff.network_latency_s
    return nbytes / _intra(device, eff) + eff.nvlink_latency_s


def bridge_volume(weight_bytes: float, tp: int, pp: int, gen_tp: int, gen_pp: int = 1) -> float:
    """Bytes each GPU receives when actor weights move from training (tp, pp) to generation (gen_tp, gen_pp).

    HybridFlow Table 2, 3D-HybridEngine row: (t*p - t_g*p_g) / (t_g*p_g*t*p) * M: each GPU all-gathers the
    shards of its micro-DP group (t*p / (t_g*p_g) ranks) and keeps its own shard in place, so nothing is
    held twice.
    """
    train, gen = tp * pp, gen_tp * gen_pp
    return (train - gen) / (gen * train) * weight_bytes


def bridge_time(weight_bytes: float, tp: int, pp: int, gen_tp: int, device: DeviceSpec,
                eff: Efficiency) -> float:
    """Time of the transition: the micro-DP group is t*p/t_g consecutive-stride ranks; inside a node when
    the training model-parallel group (t*p GPUs) is."""
    volume = bridge_volume(weight_bytes, tp, pp, gen_tp)
    if volume <= 0:
        return 0.0
    if tp * pp <= device.gpus_per_node:
        return volume / _intra(device, eff) + eff.nvlink_latency_s
    return volume / (device.inter_bytes_per_s * eff.network_efficiency) + eff.network_latency_s


def split_sync_time(weight_bytes: float, tp: int, pp: int, dp: int, gen_tp: int, gen_dp: int,
                    same_node: bool, device: DeviceSpec, eff: Efficiency) -> float:
    """Time of the weight sync into a rollout on GPUs the actor does not hold (rollout_lag=1).

    The split reshard plan (megatron_adapters/bridge/plan.py) feeds generation replica j from training replica
    j % dp point to point: each rollout GPU receives its whole generation shard M / gen_tp, and each actor
    GPU sends its training shard M / (tp * pp) once per generation replica it feeds. The busier side sets
    the time, over NVLink when both sets lie in one node, else over the network.
    """
    receive = weight_bytes / gen_tp
    send = weight_bytes / (tp * pp) * -(-gen_dp // dp)  # ceil: replicas fed per training replica
    return p2p_time(max(receive, send), not same_node, device, eff)
