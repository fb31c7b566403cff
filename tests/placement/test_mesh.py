"""RoleMesh groups: megatron's tp-dp-pp order, partitions of the ranks, coordinates that round-trip."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridflow.placement import ParallelDims, RoleMesh
from hybridflow.placement.auto.strategy import Strategy


def test_groups_small_example():
    mesh = RoleMesh("actor", tuple(range(8)), ParallelDims(2, 2, 2))
    assert mesh.tp_groups() == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert mesh.dp_groups() == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert mesh.pp_groups() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.coords(5) == (1, 0, 1)


def test_groups_follow_the_rank_list():
    mesh = RoleMesh("critic", (12, 13, 4, 5), ParallelDims(2, 1, 2))
    assert mesh.tp_groups() == [(12, 13), (4, 5)]
    assert mesh.dp_groups() == [(12, 4), (13, 5)]


def test_size_mismatch_is_rejected():
    with pytest.raises(ValueError):
        RoleMesh("actor", (0, 1, 2), ParallelDims(2, 1, 2))


@pytest.mark.parametrize("tp, dp, pp", [(2, 2, 2), (4, 1, 2), (1, 4, 2), (2, 3, 1), (8, 2, 1)])
def test_groups_equal_megatron_hyper_comm_grid(tp, dp, pp, monkeypatch):
    monkeypatch.setitem(os.environ, "WORLD_SIZE", str(tp * dp * pp))
    from megatron.core.hyper_comm_grid import HyperCommGrid

    grid = HyperCommGrid([tp, dp, pp], ["tp", "dp", "pp"])
    mesh = RoleMesh("actor", tuple(range(tp * dp * pp)), ParallelDims(tp, pp, dp))
    for dim, groups in (("tp", mesh.tp_groups()), ("dp", mesh.dp_groups()), ("pp", mesh.pp_groups())):
        assert [list(g) for g in groups] == grid._gen_rank_enum([dim]), dim


@given(tp=st.integers(1, 4), dp=st.integers(1, 4), pp=st.integers(1, 3), data=st.data())
def test_mesh_properties(tp, dp, pp, data):
    n = tp * dp * pp
    ranks = tuple(data.draw(st.permutations(range(n + data.draw(st.integers(0, 3)))))[:n])
    mesh = RoleMesh("actor", ranks, ParallelDims(tp, pp, dp))
    for groups, size in ((mesh.tp_groups(), tp), (mesh.dp_groups(), dp), (mesh.pp_groups(), pp)):
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == sorted(ranks)  # a partition of the role's ranks
    for rank in ranks:
        t, d, p = mesh.coords(rank)
        assert mesh.rank_at(t, d, p) == rank
        assert rank in mesh.tp_groups()[p * dp + d]
    # TP groups are consecutive entries of the rank list (tp fastest).
    assert [r for g in mesh.tp_groups() for r in g] == list(ranks)


@pytest.mark.parametrize("degrees", [(0, 1, 1), (1, -2, 1), (1, 1, True), (1.0, 1, 1)])
def test_a_layout_of_anything_but_positive_integers_is_refused(degrees):
    with pytest.raises(ValueError, match="is not a positive integer"):
        ParallelDims(*degrees)
    with pytest.raises(ValueError, match="is not a positive integer"):
        Strategy(*degrees)
    with pytest.raises(ValueError, match="is not a positive integer"):  # even when the rank count agrees
        RoleMesh("actor", tuple(range(max(0, int(degrees[0] * degrees[1] * degrees[2])))), ParallelDims(*degrees))


def test_one_layout_type_behind_mesh_and_strategy():
    dims = ParallelDims(2, 1, 4)
    mesh = RoleMesh("actor", tuple(range(8)), dims)
    assert mesh.dims is dims and (mesh.tp, mesh.pp, mesh.dp) == (2, 1, 4) and mesh.dims.size == mesh.size == 8
    assert RoleMesh.from_json("actor", mesh.to_json()) == mesh
    with pytest.raises(TypeError, match="not ParallelDims"):  # degrees come checked, as one ParallelDims
        RoleMesh("actor", tuple(range(8)), (2, 1, 4))
    s = Strategy(4, 1, 2, gen_tp=2)
    assert isinstance(s, ParallelDims) and (s.size, s.gpus, s.gen_dp) == (8, 8, 4)
    # the auto search's deterministic order is (tp, pp, dp, gen_tp)
    assert sorted([Strategy(2, 1, 1), Strategy(1, 2, 1, 1), Strategy(1, 2, 1), Strategy(1, 1, 2)]) == [
        Strategy(1, 1, 2), Strategy(1, 2, 1), Strategy(1, 2, 1, 1), Strategy(2, 1, 1)]
