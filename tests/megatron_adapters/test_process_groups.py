"""Per-role process groups: membership follows tp-fastest, then dp, then pp, over any rank list."""

import itertools

import pytest

from megatron_adapters.process_groups import build_role_groups, role_rank_enumeration
from tests.distributed_harness import run_distributed


def _by_formula(ranks, tp, pp, dp):
    """Reference groups from the contract: position tp_rank + tp*dp_rank + tp*dp*pp_rank of `ranks`."""
    coords = itertools.product(range(tp), range(dp), range(pp))
    at = {(t, d, p): ranks[t + tp * d + tp * dp * p] for t, d, p in coords}
    tp_groups = [[at[t, d, p] for t in range(tp)] for p in range(pp) for d in range(dp)]
    dp_groups = [[at[t, d, p] for d in range(dp)] for p in range(pp) for t in range(tp)]
    pp_groups = [[at[t, d, p] for p in range(pp)] for d in range(dp) for t in range(tp)]
    return sorted(tp_groups), sorted(dp_groups), sorted(pp_groups)


ROLES = [  # (ranks, tp, pp, dp)
    ([0, 1, 2, 3], 2, 2, 1),
    ([0, 1, 2, 3], 1, 2, 2),
    ([0, 1, 2, 3], 2, 1, 2),
    ([2, 3], 1, 2, 1),
    ([3, 1], 2, 1, 1),  # non-contiguous, out of order
    ([4, 6, 5, 7, 0, 2, 1, 3], 2, 2, 2),
]


@pytest.mark.parametrize(("ranks", "tp", "pp", "dp"), ROLES)
def test_enumeration_matches_contract_order(monkeypatch, ranks, tp, pp, dp):
    monkeypatch.setenv("WORLD_SIZE", "8")
    groups = role_rank_enumeration(ranks, tp=tp, pp=pp, dp=dp)
    got = (sorted(groups["tp"]), sorted(groups["dp"]), sorted(groups["pp"]))
    assert got == _by_formula(ranks, tp, pp, dp)
    assert sorted(groups["embd"]) == sorted(sorted({g[0], g[-1]}) for g in groups["pp"])
    assert sorted(r for g in groups["mp"] for r in g) == sorted(ranks)


def test_contiguous_ranks_equal_hypercommgrid_with_rank_offset(monkeypatch):
    from megatron.core.hyper_comm_grid import HyperCommGrid

    monkeypatch.setenv("WORLD_SIZE", "8")
    grid = HyperCommGrid([2, 1, 1, 2], ["tp", "cp", "dp", "pp"], rank_offset=4)
    groups = role_rank_enumeration([4, 5, 6, 7], tp=2, pp=2, dp=1)
    for name, dims in {"tp": "tp", "pp": "pp", "dp": "dp", "mp": ["tp", "pp"], "dp_cp": ["cp", "dp"]}.items():
        assert groups[name] == grid.get_rank_enum(dims), name


def test_context_parallel_sits_between_tp_and_dp(monkeypatch):
    from megatron.core.hyper_comm_grid import HyperCommGrid

    monkeypatch.setenv("WORLD_SIZE", "8")
    groups = role_rank_enumeration(list(range(8)), tp=2, pp=1, dp=2, cp=2)
    grid = HyperCommGrid([2, 2, 2, 1], ["tp", "cp", "dp", "pp"])
    assert groups["cp"] == grid.get_rank_enum("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sorted(map(sorted, groups["dp_cp"])) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_enumeration_matches_planner_role_mesh(monkeypatch):
    placement = pytest.importorskip("hybridflow.placement")
    if not hasattr(placement, "RoleMesh"):
        pytest.skip("hybridflow.placement.RoleMesh not available yet")
    monkeypatch.setenv("WORLD_SIZE", "8")
    for ranks, tp, pp, dp in ROLES:
        mesh = placement.RoleMesh(role="actor", ranks=tuple(ranks), dims=placement.ParallelDims(tp, pp, dp))
        groups = role_rank_enumeration(ranks, tp=tp, pp=pp, dp=dp)
        for name in ("tp", "dp", "pp"):
            expected = sorted(list(g) for g in getattr(mesh, f"{name}_groups")())
            assert sorted(groups[name]) == expected, (ranks, tp, pp, dp, name)


@pytest.mark.parametrize(
    ("ranks", "tp", "pp", "dp", "cp", "field"),
    [([0, 1, 2], 2, 1, 1, 1, "ranks"), ([0, 0], 2, 1, 1, 1, "ranks"), ([0, 1], 0, 1, 2, 1, "tp")],
)
def test_bad_sizes_name_the_field(monkeypatch, ranks, tp, pp, dp, cp, field):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=f"^{field}:"):
        role_rank_enumeration(ranks, tp=tp, pp=pp, dp=dp, cp=cp)


def _build_and_use_groups() -> dict:
    import torch
    import torch.distributed as dist

    out = {}
    for role, (ranks, tp, pp, dp) in enumerate(ROLES[:5]):
        pgs = build_role_groups(ranks, tp=tp, pp=pp, dp=dp)
        if pgs is None:
            out[role] = None
            continue
        members = {
            name: dist.get_process_group_ranks(getattr(pgs, name))
            for name in (
                "tp",
                "pp",
                "dp",
                "cp",
                "dp_cp",
                "mp",
                "tp_dp_cp",
                "embd",
                "pos_embd",
                "ep",
                "intra_dist_opt",
            )
        }
        total = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(total, group=pgs.tp)
        members["tp_sum"] = total.item()
        out[role] = members
    return out


def test_build_role_groups_in_four_ranks():
    results = run_distributed(_build_and_use_groups, world_size=4)
    for role, (ranks, tp, pp, dp) in enumerate(ROLES[:5]):
        tp_groups, dp_groups, pp_groups = _by_formula(ranks, tp, pp, dp)
        for rank, result in enumerate(results):
            if rank not in ranks:
                assert result[role] is None
                continue
            got = result[role]
            all_groups = (tp_groups, dp_groups, pp_groups)
            my_tp, my_dp, my_pp = (next(g for g in groups if rank in g) for groups in all_groups)
            assert sorted(got["tp"]) == sorted(my_tp)
            assert sorted(got["dp"]) == sorted(my_dp) == sorted(got["dp_cp"])
            assert sorted(got["pp"]) == sorted(my_pp)
            assert got["tp_sum"] == sum(my_tp)
            assert sorted(got["intra_dist_opt"]) == sorted(ranks)
            assert got["ep"] == [rank]
            pipe = sorted(my_pp, key=ranks.index)
            if rank in (pipe[0], pipe[-1]):
                assert sorted(got["embd"]) == sorted({pipe[0], pipe[-1]})


FIELDS = ("tp", "pp", "dp", "cp", "tp_cp", "dp_cp", "mp", "tp_dp_cp", "embd", "pos_embd", "ep", "intra_dist_opt")


def _two_roles_on_one_mesh() -> dict:
    import torch.distributed as dist

    from megatron_adapters.group_pool import pooled_groups

    actor = build_role_groups([0, 1, 2, 3], tp=2, pp=2, dp=1)
    ref = build_role_groups([0, 1, 2, 3], tp=2, pp=2, dp=1)
    enumeration = role_rank_enumeration([0, 1, 2, 3], tp=2, pp=2, dp=1)
    distinct = {tuple(sorted(g)) for groups in enumeration.values() for g in groups} - {(0, 1, 2, 3)}
    return {"same": {f: getattr(actor, f) is getattr(ref, f) for f in FIELDS},
            "world": actor.intra_dist_opt is dist.group.WORLD, "made": pooled_groups(), "distinct": len(distinct)}


def test_roles_on_one_mesh_share_their_groups():
    """Every NCCL communicator holds device memory outside torch's allocator: a rank list gets one group, whichever
    role or field asks for it (on one GPU all twelve fields of every role are the world's own group)."""
    for result in run_distributed(_two_roles_on_one_mesh, world_size=4):
        assert all(result["same"].values()), result["same"]
        assert result["world"]
        assert result["made"] == result["distinct"] == 8  # tp 2, pp (= embd) 2, the singletons (cp, dp, ep) 4
