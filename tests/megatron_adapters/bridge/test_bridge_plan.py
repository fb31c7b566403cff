"""ReshardPlan maths: HybridFlow grouping, split placement, the byte optimum, and bad layouts."""

import pytest

from hybridflow.placement import ParallelDims, RoleMesh
from hybridflow.placement.generation import generation_mesh
from megatron_adapters.bridge import build_reshard_plan, hybridflow_optimal_bytes


def _actor(ranks, tp, pp, dp):
    return RoleMesh("actor", tuple(ranks), ParallelDims(tp, pp, dp))


def _rollout(ranks, tp):
    return RoleMesh("rollout", tuple(ranks), ParallelDims(tp, 1, len(ranks) // tp))


def _plan(tp, pp, tg, n=4):
    return build_reshard_plan(_actor(range(n), tp, pp, n // (tp * pp)), _rollout(range(n), tg))


def test_hybridflow_example_tp4_to_tp2():
    # The paper's figure: t=4, t_g=2 -> generation TP groups [G1, G3], [G2, G4];
    # micro-DP groups [G1, G2], [G3, G4].
    plan = _plan(4, 1, 2)
    assert plan.generation_tp_groups() == [(0, 2), (1, 3)]
    assert plan.micro_dp_groups() == [(0, 1), (2, 3)]
    assert plan.micro_dp_size == 2
    assert generation_mesh(plan.train, plan.gen).ranks == (0, 2, 1, 3)  # the planner's rollout mesh
    assert generation_mesh(plan.train, plan.gen).tp_groups() == plan.generation_tp_groups()


def test_pipeline_stages_join_the_micro_dp_group():
    plan = _plan(2, 2, 1)  # ranks: tp fastest, then pp -> stage 0 = {0, 1}, stage 1 = {2, 3}
    assert plan.micro_dp_groups() == [(0, 1, 2, 3)]
    assert plan.generation_tp_groups() == [(0,), (1,), (2,), (3,)]
    plan = _plan(2, 2, 2)
    assert plan.micro_dp_groups() == [(0, 2), (1, 3)]
    assert plan.generation_tp_groups() == [(0, 1), (2, 3)]


def test_larger_generation_tp_slices_locally():
    plan = _plan(2, 1, 4)  # two training replicas {0, 1}, {2, 3} form one generation TP group
    assert plan.micro_dp_groups() == []
    assert plan.generation_tp_groups() == [(0, 2, 1, 3)]  # gen rank = tp_t * 2 + replica
    assert hybridflow_optimal_bytes(plan, 1000) == 0.0


def test_optimum_formula():
    assert hybridflow_optimal_bytes(_plan(2, 2, 1), 400) == pytest.approx(3 / 4 * 400)
    assert hybridflow_optimal_bytes(_plan(2, 1, 1), 400) == pytest.approx(1 / 2 * 400)
    assert hybridflow_optimal_bytes(_plan(2, 1, 2), 400) == 0.0


def test_split_placement_feeds_generation_replicas_round_robin():
    plan = build_reshard_plan(_actor((0, 1), 2, 1, 1), _rollout((2, 3, 4, 5), 2))
    assert not plan.colocated
    assert [(s.tp_rank, s.dp_rank, s.replica) for _, s in sorted(plan.slots.items())] == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (1, 1, 0),
    ]


def test_bad_layouts_name_the_setting():
    with pytest.raises(ValueError, match="placement.resources.rollout"):
        build_reshard_plan(_actor((0, 1), 2, 1, 1), _rollout((1, 2), 1))
    with pytest.raises(ValueError, match="roles.rollout.parallel.tp"):
        build_reshard_plan(_actor(range(12), 4, 1, 3), _rollout(range(12), 3))
    with pytest.raises(ValueError, match="tp\\*pp\\*dp"):
        _actor((0, 1, 2), 2, 1, 1)


@pytest.mark.parametrize("tp, pp, tg, split", [(4, 1, 2, False), (2, 2, 1, False), (2, 1, 4, False),
                                               (1, 2, 2, False), (2, 1, 2, True), (1, 1, 2, True)])
def test_the_plans_generation_mesh_gives_the_same_reshard_plan_as_the_listing(tp, pp, tg, split):
    """The run builds its reshard plan from the Plan's rollout mesh (generation order), not the listing."""
    actor = _actor(range(tp * pp), tp, pp, 1) if split else _actor(range(4), tp, pp, 4 // (tp * pp))
    listed = _rollout(range(tp * pp, tp * pp + 4) if split else (3, 1, 2, 0), tg)
    assert build_reshard_plan(actor, generation_mesh(actor, listed)).slots == build_reshard_plan(actor, listed).slots
