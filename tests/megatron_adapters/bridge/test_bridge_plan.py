"""ReshardPlan maths: HybridFlow grouping, split placement, the byte optimum, and bad layouts."""

import pytest

from megatron_adapters.bridge import (
    GenerationLayout,
    TrainingLayout,
    build_reshard_plan,
    hybridflow_optimal_bytes,
)


def _plan(tp, pp, tg, n=4):
    return build_reshard_plan(
        TrainingLayout(tuple(range(n)), tp, pp, n // (tp * pp)), GenerationLayout(tuple(range(n)), tg)
    )


def test_hybridflow_example_tp4_to_tp2():
    # The paper's figure: t=4, t_g=2 -> generation TP groups [G1, G3], [G2, G4];
    # micro-DP groups [G1, G2], [G3, G4].
    plan = _plan(4, 1, 2)
    assert plan.generation_tp_groups() == [(0, 2), (1, 3)]
    assert plan.micro_dp_groups() == [(0, 1), (2, 3)]
    assert plan.micro_dp_size == 2
    assert plan.generation_rank_order() == (0, 2, 1, 3)


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
    plan = build_reshard_plan(TrainingLayout((0, 1), 2, 1, 1), GenerationLayout((2, 3, 4, 5), 2))
    assert not plan.colocated
    assert [(s.tp_rank, s.dp_rank, s.replica) for _, s in sorted(plan.slots.items())] == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (1, 1, 0),
    ]


def test_bad_layouts_name_the_setting():
    with pytest.raises(ValueError, match="placement.resources.rollout"):
        build_reshard_plan(TrainingLayout((0, 1), 2, 1, 1), GenerationLayout((1, 2), 1))
    with pytest.raises(ValueError, match="roles.rollout.parallel.tp"):
        build_reshard_plan(TrainingLayout(tuple(range(12)), 4, 1, 3), GenerationLayout(tuple(range(12)), 3))
    with pytest.raises(ValueError, match="tp\\*pp\\*dp"):
        TrainingLayout((0, 1, 2), 2, 1, 1)
