"""Enumerations of Algorithm 1: set partitions, GPU allocations, rank ranges."""

from hybridflow.placement.auto.partitions import allocations, rank_ranges, set_partitions, set_sizes


def test_set_partitions_are_bell_many_distinct_and_complete():
    for n, bell in [(1, 1), (2, 2), (3, 5), (4, 15), (5, 52)]:
        items = tuple("abcde"[:n])
        parts = list(set_partitions(items))
        assert len(parts) == bell
        canonical = {frozenset(frozenset(s) for s in p) for p in parts}
        assert len(canonical) == bell
        for p in parts:
            assert sorted(x for s in p for x in s) == list(items)
    assert list(set_partitions(("a", "b", "c")))[0] == (("a", "b", "c"),)  # colocated first


def test_set_sizes_are_whole_nodes_or_powers_of_two_below_a_node():
    assert set_sizes(32, 8) == [1, 2, 4, 8, 16, 24, 32]
    assert set_sizes(4, 4) == [1, 2, 4]


def test_allocations_use_every_gpu_and_respect_minimums():
    allocs = list(allocations(32, 8, [8, 2]))
    assert allocs and all(sum(a) == 32 for a in allocs)
    assert all(a[0] >= 8 and a[1] >= 2 for a in allocs)
    assert (24, 8) in allocs and (8, 24) in allocs
    # Sub-node sets (2 + 4) never leave a node partly empty: 26 + ... does not add up to whole nodes.
    assert all(sum(s for s in a if s < 8) % 8 == 0 for a in allocations(32, 8, [1, 1, 1]))
    assert list(allocations(16, 8, [16, 8])) == []
    vetoed = list(allocations(32, 8, [8, 8], allowed=lambda i, n: not (i == 0 and n == 16)))
    assert all(a[0] != 16 for a in vetoed) and (24, 8) in vetoed


def test_rank_ranges_are_consecutive_and_aligned():
    ranges = rank_ranges((2, 16, 4, 2), 8)
    starts = {r.start for r in ranges}
    assert sorted(x for r in ranges for x in r) == list(range(24))
    assert ranges[1] == range(0, 16) and 0 in starts
    for size, r in zip((2, 16, 4, 2), ranges, strict=True):
        assert len(r) == size and r.start % min(size, 8) == 0
