"""A small send / recv / all-gather interface over torch.distributed groups (gloo on CPU, NCCL on GPU).

Point-to-point batches go through a ``megatron.core.resharding`` ``CopyService`` (its submit_send /
submit_recv / run interface). megatron-core's own Gloo and NCCL services create a ``torch.cuda.Stream`` in
their constructor, so they cannot run in a CPU-only process; ``P2PCopyService`` below is the same interface
on plain ``batch_isend_irecv``, valid for both backends. The bytes every rank receives are counted, so tests
and benchmarks can compare them with HybridFlow's optimum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core.resharding.copy_services.base import CopyService, RecvOp, SendOp

from megatron_adapters.group_pool import shared_group


class P2PCopyService(CopyService):
    """megatron-core's CopyService contract on ``torch.distributed.batch_isend_irecv`` (global ranks)."""

    def __init__(self) -> None:
        super().__init__(group=None)
        self.send_ops: list[SendOp] = []
        self.recv_ops: list[RecvOp] = []

    def submit_send(self, src_tensor: torch.Tensor, dest_rank: int, task_id: int | None = None) -> None:
        self.send_ops.append(SendOp(task_id=task_id, tensor=src_tensor, dest_rank=dest_rank))

    def submit_recv(self, dest_tensor: torch.Tensor, src_rank: int, task_id: int | None = None) -> None:
        self.recv_ops.append(RecvOp(task_id=task_id, tensor=dest_tensor, src_rank=src_rank))

    def run(self) -> None:
        """Run every submitted op as one batch and wait for it (same-rank ops are not expected here)."""
        if any(op.dest_rank == self.rank for op in self.send_ops) or any(
            op.src_rank == self.rank for op in self.recv_ops
        ):
            raise RuntimeError("bridge: a rank's own shard is copied locally, never sent to itself")
        ops = [dist.P2POp(dist.isend, op.tensor, op.dest_rank) for op in self.send_ops]
        ops += [dist.P2POp(dist.irecv, op.tensor, op.src_rank) for op in self.recv_ops]
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        self.send_ops.clear()
        self.recv_ops.clear()


class BridgeTransport:
    """All-gather inside micro-DP groups and point-to-point exchanges, with a received-bytes counter."""

    def __init__(self, groups: dict[tuple[int, ...], dist.ProcessGroup]) -> None:
        self.groups = groups
        self.rank = dist.get_rank()
        self.p2p = P2PCopyService()
        self.bytes_received = 0

    def all_gather(self, buffer: torch.Tensor, member_numel: Sequence[int], group_ranks: tuple[int, ...]) -> None:
        """In place: member i's elements sit at their offset in ``buffer`` (this rank's already filled)."""
        group = self.groups[group_ranks]
        me = group_ranks.index(self.rank)
        size = buffer.element_size()
        equal = len(set(member_numel)) == 1
        if equal and dist.get_backend(group) == "nccl":
            # Equal contributions (PP_t = 1): one ring all-gather, in place (input aliases its output chunk).
            chunk = member_numel[0]
            dist.all_gather_into_tensor(buffer, buffer[me * chunk : (me + 1) * chunk], group=group)
        else:
            # Uneven contributions (pipeline stages differ) or gloo: each member broadcasts its own chunk
            # in place, so no rank stages a second copy of the bucket; bytes on the wire are the same.
            offset = 0
            for i, n in enumerate(member_numel):
                if n:
                    dist.broadcast(buffer[offset : offset + n], src=group_ranks[i], group=group)
                offset += n
        self.bytes_received += (sum(member_numel) - member_numel[me]) * size

    def exchange(self, sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]]) -> None:
        """Send ``(tensor, peer)`` pairs and receive into ``(tensor, peer)`` pairs as one batch."""
        for tensor, peer in sends:
            self.p2p.submit_send(tensor, peer)
        for tensor, peer in recvs:
            self.p2p.submit_recv(tensor, peer)
            self.bytes_received += tensor.numel() * tensor.element_size()
        self.p2p.run()


def build_transport(micro_dp_groups: Sequence[tuple[int, ...]]) -> BridgeTransport:
    """Create one process group per micro-DP group. Collective: every rank calls it with the same groups."""
    groups = {}
    for ranks in micro_dp_groups:
        group = shared_group(ranks)
        if dist.get_rank() in ranks:
            groups[tuple(ranks)] = group
    return BridgeTransport(groups)
