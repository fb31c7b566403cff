"""Moving a role's per-replica results to every rank: tensors move, Python objects do not.

A role splits a step's batch over its DP replicas (contiguous row blocks). After a stage, each replica's
collect rank (TP rank 0 of the last pipeline stage, where outputs live) broadcasts its block, so every rank
ends with the whole [B, ...] tensor whichever roles it holds. Roles on disjoint ranks compute first and
exchange afterwards, so their stages overlap in time.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybridflow.placement import RoleMesh


def collect_ranks(mesh: RoleMesh) -> list[int]:
    """Global rank that holds replica d's result, for d in 0..dp-1."""
    return [mesh.rank_at(0, d, mesh.pp - 1) for d in range(mesh.dp)]


def share_from_role(
    local: torch.Tensor | None, mesh: RoleMesh, rows: int, trailing: tuple[int, ...], dtype: torch.dtype,
    device: torch.device, group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Assemble a [rows, *trailing] tensor from the role's replicas on every rank of `group` (None: the world).

    `local` is this rank's replica block ([rows/dp, *trailing]) on ranks of the role, ignored elsewhere.
    """
    per_replica = rows // mesh.dp
    blocks = []
    me = dist.get_rank()
    for src in collect_ranks(mesh):
        if me == src:
            buf = local.to(device=device, dtype=dtype).contiguous()
        else:
            buf = torch.empty((per_replica, *trailing), dtype=dtype, device=device)
        dist.broadcast(buf, src, group=group)
        blocks.append(buf)
    return torch.cat(blocks)
