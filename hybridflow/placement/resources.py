"""Parse `placement.resources` GPU lists into ordered global ranks.

Accepted entries (mixable in one list, order kept, since it sets the role's rank order):
  3            global rank            "3"          the same as a string
  "0-3"        global ranks 0..3      "all"        every GPU of the cluster
  "node1:[0,1]" node-local indices    "node1:0-3"  node-local range       "node1:all"  a whole node
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hybridflow.config.cluster import ClusterConfig
from hybridflow.errors import UserError

_NODE = re.compile(r"node(\d+):(.+)")
_RANGE = re.compile(r"(\d+)-(\d+)")


def parse_gpu_list(entries: Sequence[int | str], cluster: ClusterConfig, field: str) -> tuple[int, ...]:
    """Global ranks named by `entries`, in order. Raises UserError (naming `field`) on bad entries,
    out-of-range GPUs or nodes, and GPUs listed twice."""
    if isinstance(entries, (str, int)):
        entries = [entries]
    ranks: list[int] = []
    for entry in entries:
        ranks.extend(_parse_entry(entry, cluster, field))
    if not ranks:
        raise UserError(f"{field}: empty GPU list; list at least one GPU, e.g. [0] or [all]")
    seen: set[int] = set()
    for rank in ranks:
        if rank in seen:
            raise UserError(f"{field}: GPU {rank} is listed twice; list each GPU once")
        seen.add(rank)
    return tuple(ranks)


def _parse_entry(entry: int | str, cluster: ClusterConfig, field: str) -> list[int]:
    world = cluster.world_size
    if isinstance(entry, bool) or not isinstance(entry, (int, str)):
        raise UserError(f"{field}: {entry!r} is not a GPU; use an index, 'a-b', 'all' or 'node0:[0,1]'")
    if isinstance(entry, int):
        return [_check_global(entry, cluster, field)]
    text = entry.replace(" ", "")
    node_match = _NODE.fullmatch(text)
    if node_match:
        node = int(node_match.group(1))
        if node >= cluster.nodes:
            raise UserError(
                f"{field}: node{node} does not exist (cluster.nodes={cluster.nodes}); "
                f"use node0..node{cluster.nodes - 1}"
            )
        local = _parse_indices(node_match.group(2), cluster.gpus_per_node, field, f"node{node} GPU")
        return [node * cluster.gpus_per_node + i for i in local]
    return [_check_global(r, cluster, field) for r in _parse_indices(text, world, field, "GPU", check=False)]


def _parse_indices(text: str, size: int, field: str, what: str, check: bool = True) -> list[int]:
    """'all' | 'i' | 'a-b' | '[i, a-b, ...]' -> indices; with `check`, each must be < size."""
    if text == "all":
        return list(range(size))
    items = text[1:-1].split(",") if text.startswith("[") and text.endswith("]") else [text]
    out: list[int] = []
    for item in items:
        if item.isdigit():
            out.append(int(item))
        elif (m := _RANGE.fullmatch(item)) and int(m.group(1)) <= int(m.group(2)):
            out.extend(range(int(m.group(1)), int(m.group(2)) + 1))
        else:
            raise UserError(f"{field}: cannot read {text!r}; use an index, 'a-b', 'all', '[0,1]' or 'node0:[0,1]'")
    if check:
        for i in out:
            if i >= size:
                raise UserError(f"{field}: {what} {i} is out of range (gpus_per_node={size}); use 0..{size - 1}")
    return out


def _check_global(rank: int, cluster: ClusterConfig, field: str) -> int:
    world = cluster.world_size
    if not 0 <= rank < world:
        raise UserError(
            f"{field}: GPU {rank} is out of range for {world} GPUs (cluster.nodes={cluster.nodes} x "
            f"cluster.gpus_per_node={cluster.gpus_per_node}); use 0..{world - 1}"
        )
    return rank
