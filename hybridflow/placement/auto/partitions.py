"""Enumerations of Algorithm 1: colocation sets (set partitions of the roles) and GPU allocations to them."""

from __future__ import annotations

from collections.abc import Callable, Iterator


def set_partitions(items: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every partition of `items` into non-empty sets, each set and the partition in a canonical order.

    The first partition is the single set (everything colocated); Bell(4) = 15 partitions for 4 roles.
    """
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for sub in set_partitions(rest):
        # `first` joins each existing set in turn, or starts its own.
        for i in range(len(sub)):
            yield tuple(((first,) + s) if j == i else s for j, s in enumerate(sub))
        yield ((first,),) + sub


def set_sizes(world: int, gpus_per_node: int) -> list[int]:
    """GPU counts a colocation set may get: whole nodes, or a power-of-two share of one node.

    These pack onto node-aligned consecutive ranks, so TP groups never straddle a node and the search
    space stays small (19 sizes for 16 x 8 GPUs instead of 128).
    """
    sizes = []
    part = 1
    while part < gpus_per_node and part <= world:
        sizes.append(part)
        part *= 2
    sizes += list(range(gpus_per_node, world + 1, gpus_per_node))
    return sizes


def _packs(sizes: list[int], gpus_per_node: int) -> bool:
    """Sub-node sets (powers of two) fill whole nodes together: largest first, each aligned to its size."""
    small = sorted((s for s in sizes if s < gpus_per_node), reverse=True)
    return sum(small) % gpus_per_node == 0 if small else True


def allocations(world: int, gpus_per_node: int, minimum: list[int],
                allowed: Callable[[int, int], bool] | None = None) -> Iterator[tuple[int, ...]]:
    """Every way to give all `world` GPUs to len(minimum) sets, set i at least `minimum[i]` GPUs.

    `allowed(i, size)` may veto sizes (a set that does not fit, or has no valid strategy, at that size).
    """
    sizes = set_sizes(world, gpus_per_node)
    k = len(minimum)

    def walk(i: int, left: int, chosen: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if i == k - 1:
            if left in sizes and left >= minimum[i] and (allowed is None or allowed(i, left)):
                full = chosen + (left,)
                if _packs(list(full), gpus_per_node):
                    yield full
            return
        need_after = sum(minimum[i + 1:])
        for size in sizes:
            if size < minimum[i] or size > left - need_after:
                continue
            if allowed is not None and not allowed(i, size):
                continue
            yield from walk(i + 1, left - size, chosen + (size,))

    yield from walk(0, world, ())


def rank_ranges(sizes: tuple[int, ...], gpus_per_node: int) -> list[range]:
    """Consecutive node-aligned rank ranges for sets of `sizes` (returned in the order of `sizes`).

    Whole-node sets go first, then sub-node sets largest first, so each starts at a multiple of its size.
    """
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i] < gpus_per_node, -sizes[i], i))
    out: list[range] = [range(0)] * len(sizes)
    start = 0
    for i in order:
        out[i] = range(start, start + sizes[i])
        start += sizes[i]
    return out
