"""HybridFlow's placement findings (EuroSys'25 section 8.4) under our cost model and memory estimator.

Each test runs the search on the paper's setup (conftest.py) and asserts which placement it chooses; no
predicted times are hard-coded.
"""

import pytest

from hybridflow.errors import UserError
from hybridflow.placement.auto import search_config, search_placement
from hybridflow.placement.planner import build_plan
from tests.placement.auto.conftest import paper_config

SIZES = ("7b", "13b", "34b", "70b")


def colocated(result):
    return next(p for p in result.partitions if len(p.partition) == 1)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("gpus", (16, 32, 64))
def test_colocating_all_models_is_chosen_from_16_to_64_gpus(paper, size, gpus):
    cfg = paper(size, gpus)
    try:
        result = search_config(cfg)
    except UserError as err:  # the model does not fit at all on this many GPUs (34B/70B at 16)
        pytest.skip(f"nothing fits: {err}")
    if colocated(result).best is None:
        pytest.skip(f"colocating all four models does not fit memory: {colocated(result).reason}")
    assert len(result.chosen.sets) == 1, result.chosen


def _actor_apart_from_critic(result):
    sets = result.chosen.partition
    return not any({"actor", "critic"} <= set(s) for s in sets)


def test_split_is_chosen_for_34b_at_128_gpus(paper):
    # A close call (118.5 s vs 118.6 s colocated): the split's concurrent preparation and training save 7.4 s
    # and its generation on 64 GPUs costs 7.2 s (mostly prefill). It rests on the assumed 0.5 s per role
    # pass (Efficiency.role_pass_overhead_s); below ~0.46 s colocation wins.
    assert _actor_apart_from_critic(search_config(paper("34b", 128)))


@pytest.mark.xfail(strict=True, reason=(
    "the cost model keeps 13B colocated at 128 GPUs (57.0 s vs 65.9 s for {critic, ref} x64 + {actor, reward} "
    "x64): Llama-2-13B has no GQA (0.8 MB of KV per token), so a decode step streams 3x more KV than weights "
    "and on 64 GPUs each GPU streams twice as much (+6.4 s), prefill gets half the FLOP/s (+2.0 s), and the "
    "1024 sequences' KV (1.7 TB) overflows 64 GPUs' 30 % rollout budget (1.4 TB), so a second round re-streams "
    "the weights (+2.1 s) and repeats the per-step latency (+1.9 s); concurrent preparation and training save "
    "3.4 s. It holds for every assumed figure over its plausible range (it would take ~3.5 s per role pass), "
    "and with room for one round the split still loses 5.4 s"))
def test_split_is_chosen_for_13b_at_128_gpus(paper):
    assert _actor_apart_from_critic(search_config(paper("13b", 128)))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("gpus", (16, 32, 64, 128))
def test_returned_plan_passes_the_memory_estimator(size, gpus):
    cfg = paper_config(size, gpus)  # hybridflow's own runtime: the plan must build (and vLLM span the job)
    try:
        plan, explanation = search_placement(cfg)  # build_plan inside raises if the estimator rejects it
    except UserError as err:
        assert str(err).startswith("placement: no placement")  # nothing fits: said so, nothing returned
        return
    assert plan.over_capacity() == []
    # build_plan runs the estimator and every explicit-placement check again from the plan's own layout.
    again = build_plan(cfg, {r: m.ranks for r, m in plan.meshes.items()}, plan.meshes)
    assert again.over_capacity() == []
    assert set(again.meshes) == {"actor", "critic", "ref", "reward", "rollout"}
    assert set(plan.meshes["rollout"].ranks) == set(plan.meshes["actor"].ranks)
    assert explanation.total_s == pytest.approx(sum(explanation.stage_s.values()))


def test_search_is_deterministic_on_the_paper_setup(paper):
    first, second = search_config(paper("13b", 128)), search_config(paper("13b", 128))
    assert first.chosen == second.chosen
    assert [p.best.total if p.best else None for p in first.partitions] == \
        [p.best.total if p.best else None for p in second.partitions]


def test_explanation_names_why_the_split_lost_at_small_scale(paper):
    _, explanation = search_placement(paper("13b", 32))
    assert explanation.why.startswith("colocating every role wins")
    losers = [r for r in explanation.runners_up if r.total_s is not None]
    assert losers and all(r.total_s >= explanation.total_s for r in losers)
    assert "generation +" in losers[0].reason  # the split's actor generates on fewer GPUs
    text = explanation.format()
    assert "runners-up:" in text and "calibrated: 0 of" in text


def test_explanation_names_the_constraint_that_decided_13b_at_96_gpus(paper):
    # 96 = 3 x 32 GPUs: with tp | 40 heads and pp | 40 layers, dp = 96 / (tp x pp) always keeps the factor 3,
    # and no such dp divides the 256-sample mini-batch, so colocating everything on all 96 GPUs is impossible:
    # that, not a cost comparison, is why the chosen plan splits.
    result = search_config(paper("13b", 96))
    assert len(result.chosen.sets) > 1
    colocated_reason = colocated(result).reason
    assert "dp = 96 GPUs / (tp x pp) can be 3, 6, 12, 24, 48, 96" in colocated_reason
    assert "mini-batch of 256 samples" in colocated_reason
    _, explanation = search_placement(paper("13b", 96))
    assert explanation.why.startswith("colocating every role on all 96 GPUs is ruled out (actor on 96 GPUs")
    assert "mini-batch of 256" in explanation.why and "splitting wins" not in explanation.why
