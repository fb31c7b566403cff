"""One torch.distributed group per distinct rank list, shared by every caller that asks for those ranks.

Every NCCL communicator holds device memory of its own, outside torch's caching allocator (its buffers and work
queues; NVIDIA/nccl#864), and a group bound to a GPU (`init_process_group(device_id=...)`) makes its communicator
at once. A run asks for 12 groups per role (`process_groups`), the training group and the bridge's; within a
mesh several of them have the same ranks (all of them on one GPU), and roles on the same mesh ask for the same
lists again. A group runs its operations in the order each rank issues them, and every caller here issues them in
program order, so one group serves every request for the same ranks.
"""

from __future__ import annotations

from collections.abc import Iterable
from weakref import WeakKeyDictionary

import torch.distributed as dist

# per default group (a test may tear one down and start another in the same process): sorted ranks -> group
_POOLS: WeakKeyDictionary = WeakKeyDictionary()


def shared_group(ranks: Iterable[int]) -> dist.ProcessGroup:
    """The group over `ranks`: the world's own group when they are every rank, else one `dist.new_group`, made
    the first time these ranks are asked for. Collective over the world when it makes one: every rank asks for
    the same rank lists in the same order. Ranks outside `ranks` get what `new_group` gives them (not a member)."""
    key = tuple(sorted(ranks))
    world = dist.group.WORLD
    if key == tuple(range(dist.get_world_size())):
        return world
    pool = _POOLS.setdefault(world, {})
    if key not in pool:
        pool[key] = dist.new_group(ranks=list(key))
    return pool[key]


def pooled_groups() -> int:
    """How many groups the pool has made under the current default group (the world's own not counted)."""
    return len(_POOLS.get(dist.group.WORLD, {}))
