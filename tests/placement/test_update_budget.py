"""The planner's pick of an unset `roles.<role>.update_max_tokens` (placement/update_budget.py): the largest
candidate budget that fits, after the offload share; 0 and explicit budgets stay what they say."""

from __future__ import annotations

import pytest

from hybridflow.config.parallel import micro_batch_split
from hybridflow.placement import plan_placement
from hybridflow.placement.auto.from_config import plan_candidate, search_config, search_placement
from hybridflow.placement.memory import GIB, micro_batch_shape
from hybridflow.placement.mesh import ParallelDims, RoleMesh
from hybridflow.placement.report import format_plan
from hybridflow.placement.update_budget import UPDATE_BUDGET_CAP, budget_candidates, keeps_pipeline_busy
from hybridflow.resolve import resolve_experiment

ONE_B = ("ppo_llama_1b_h200", "roles.actor.micro_batch_size=1", "roles.critic.micro_batch_size=1")
HEADROOM = "cluster.gpu_memory_headroom_gib=9"  # fixed: unset, it scales with the capacity the tests vary
BOTH_ZERO = ("roles.actor.update_max_tokens=0", "roles.critic.update_max_tokens=0")


def _cfg(*overrides: str):
    return resolve_experiment(overrides[0], list(overrides[1:]))


def _peak(plan) -> int:
    return max(m.total for m in plan.memory.values())


def test_candidates_double_from_the_smallest_micro_batch_up_to_the_cap():
    cfg = _cfg(*ONE_B)  # seq_length 2048, micro_batch_size 1
    assert budget_candidates(cfg, ("actor", "critic")) == [4096, 8192, 16384]
    cfg = _cfg("ppo_llama_1b_h200", "data.seq_length=1536", "data.max_prompt_length=512")
    assert budget_candidates(cfg, ("actor",)) == [12288, UPDATE_BUDGET_CAP]  # 4 x 1536 doubled, then the cap
    # 64 x 320 rows already exceed the cap
    assert budget_candidates(_cfg("grpo_smollm2", "roles.actor.update_max_tokens=null"), ("actor",)) == []


def test_the_planner_picks_the_largest_budget_that_fits():
    # Peaks at each explicit budget, then a GPU between the 8192 and 16384 peaks: the pick is 8192.
    peaks = {t: _peak(plan_placement(_cfg(*ONE_B, f"roles.actor.update_max_tokens={t}",
                                          f"roles.critic.update_max_tokens={t}", "placement.check_memory=false")))
             for t in (0, 4096, 8192, 16384)}
    assert peaks[0] < peaks[4096] < peaks[8192] < peaks[16384]  # more rows per micro-batch, more activations
    capacity = (peaks[8192] + peaks[16384]) / 2 / GIB + 9
    plan = plan_placement(_cfg(*ONE_B, HEADROOM, f"cluster.gpu_memory_gib={capacity}"))
    assert plan.update_max_tokens == {"actor": 8192, "critic": 8192}
    assert _peak(plan) == peaks[8192]
    # on the shipped 141 GiB the cap fits
    assert plan_placement(_cfg(*ONE_B)).update_max_tokens == {"actor": 16384, "critic": 16384}


def test_nothing_larger_fits_leaves_micro_batch_size_rows():
    base = plan_placement(_cfg(*ONE_B, *BOTH_ZERO))
    capacity = _peak(base) / GIB + 9 + 0.01
    plan = plan_placement(_cfg(*ONE_B, HEADROOM, f"cluster.gpu_memory_gib={capacity}"))
    assert plan.update_max_tokens == {"actor": 0, "critic": 0}
    assert plan.memory == base.memory


def test_zero_is_micro_batch_size_rows_and_explicit_budgets_are_kept():
    cfg = _cfg(*ONE_B, *BOTH_ZERO)
    plan = plan_placement(cfg)
    assert plan.update_max_tokens == {"actor": 0, "critic": 0}
    rows = cfg.algorithm.mini_batch_size  # dp 1
    for role in ("actor", "critic"):  # the update's rows as before the planner picked budgets
        assert micro_batch_shape(cfg, role, 1).rows == 1
        assert micro_batch_shape(cfg, role, 1).count == micro_batch_split(rows, 1)[0] == rows
        assert cfg.roles.get(role).update_micro_batch_size(cfg.data.seq_length, plan.update_max_tokens[role]) == 1
    explicit = plan_placement(_cfg(*ONE_B, "roles.actor.update_max_tokens=4096"))
    assert explicit.update_max_tokens == {"actor": 4096, "critic": 16384}  # the critic's is still picked


def test_the_offload_share_is_picked_first_and_the_budget_does_not_raise_it():
    # ppo_llama3_8b_4gpu offloads with the share unset: the share is the one picked at micro_batch_size rows.
    picked = plan_placement(_cfg("ppo_llama3_8b_4gpu"))
    at_zero = plan_placement(_cfg("ppo_llama3_8b_4gpu", *BOTH_ZERO))
    assert picked.offload_fractions == at_zero.offload_fractions
    assert 0 < min(picked.offload_fractions.values()) < 1
    assert not picked.over_capacity()
    # with more GPU memory the share drops to 0 first, then the budget grows
    roomy = plan_placement(_cfg("ppo_llama3_8b_4gpu", "cluster.gpu_memory_gib=141"))
    assert roomy.offload_fractions == {"actor": 0.0, "critic": 0.0}
    assert min(roomy.update_max_tokens.values()) > 0


def test_a_pipelined_role_keeps_at_least_pp_micro_batches():
    cfg = _cfg("ppo_llama_1b_h200", "roles.actor.micro_batch_size=1", "algorithm.mini_batch_size=8",
               "data.seq_length=1024", "data.max_prompt_length=512", "rollout.max_new_tokens=512")
    meshes = {"actor": RoleMesh(role="actor", ranks=(0, 1, 2, 3), dims=ParallelDims(1, 4, 1))}
    assert keeps_pipeline_busy(cfg, ("actor",), meshes, 2048)  # 2 rows: 4 micro-batches
    assert not keeps_pipeline_busy(cfg, ("actor",), meshes, 4096)  # 4 rows: 2 < pp
    flat = {"actor": RoleMesh(role="actor", ranks=(0,), dims=ParallelDims(1, 1, 1))}
    assert keeps_pipeline_busy(cfg, ("actor",), flat, 8192)


def test_the_report_prints_the_budgets():
    text = format_plan(plan_placement(_cfg(*ONE_B)))
    assert "update micro-batch token budget (roles.<role>.update_max_tokens): actor 16384, critic 16384" in text
    text = format_plan(plan_placement(_cfg(*ONE_B, *BOTH_ZERO)))
    assert "actor micro_batch_size rows, critic micro_batch_size rows" in text


def test_the_search_prices_its_chosen_plan_at_the_budget_the_plan_picks():
    # The search prices layouts at micro_batch_size rows; build_plan then picks the budget (16384 here):
    # the search's figure for its choice must be the plan's, and smaller than at micro_batch_size rows.
    cfg = _cfg(*ONE_B, "placement=auto")
    result = search_config(cfg)
    plan, _ = search_placement(cfg)
    assert min(plan.update_max_tokens.values()) > 0
    assert result.chosen.total == pytest.approx(plan_candidate(cfg, plan).total, rel=1e-9)
    assert result.chosen in [p.best for p in result.partitions]
    at_zero = _cfg(*ONE_B, "placement=auto", *BOTH_ZERO)
    assert result.chosen.total < plan_candidate(at_zero, search_placement(at_zero)[0]).total
