"""The auto search at trainer.rollout_lag=1: the rollout on GPUs of its own, generation overlapping the rest."""

from dataclasses import astuple, replace

import pytest

from hybridflow import plan as plan_cli
from hybridflow.config import load_experiment
from hybridflow.config.cluster import ClusterConfig
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.placement.auto import search_config, search_placement, workload_from_config
from hybridflow.placement.auto.device import DeviceSpec, Efficiency
from hybridflow.placement.auto.from_config import plan_candidate, plan_from_candidate
from hybridflow.placement.auto.search import Candidate, search
from hybridflow.placement.auto.strategy import strategies_for
from hybridflow.placement.auto.workload import GENERATION, PREPARATION, TRAINING, Workload, split_rollout
from tests.placement.auto.paper_workload import LLAMA_SHAPES, ppo_roles

GIB = 2**30
LAG1 = ["placement=auto", "trainer.rollout_lag=1"]


def test_tiny_cpu_at_lag_1_puts_the_rollout_on_gpus_the_actor_does_not_hold():
    plan = plan_placement(load_experiment("tiny_cpu", LAG1))  # build_plan ran check_rollout_lag
    actor, rollout = plan.meshes["actor"], plan.meshes["rollout"]
    assert not set(actor.ranks) & set(rollout.ranks)
    assert sorted({r for m in plan.meshes.values() for r in m.ranks}) == list(range(4))
    # The rollout's memory is its own: its weights (none shared with an actor) and its KV cache.
    for rank in rollout.ranks:
        mem = plan.role_memory[rank]["rollout"]
        assert mem.weights > 0 and mem.kv_cache > 0 and mem.grads == 0 and mem.optimizer == 0


def test_every_partitions_best_at_lag_1_is_a_plan_build_plan_accepts():
    # What the search may return must run: not only the winner, every partition's best.
    cfg = load_experiment("tiny_cpu", LAG1)
    result = search_config(cfg)
    assert result.partitions and all(p.best is not None for p in result.partitions)
    for p in result.partitions:
        plan = plan_from_candidate(cfg, p.best)
        assert not set(plan.meshes["actor"].ranks) & set(plan.meshes["rollout"].ranks)
        assert not any("actor" in s and "rollout" in s for s in p.partition)


def test_an_explicit_lag_1_plan_is_priced_with_the_overlap_as_the_search_prices_it():
    # plan_candidate (hybridflow.plan's and the benchmarks' predictor) must give the search's own total on
    # the plan the search chose, overlap included; else explicit and auto plans are costed differently.
    cfg = load_experiment("tiny_cpu", LAG1)
    chosen = search_config(cfg).chosen
    priced = plan_candidate(cfg, plan_from_candidate(cfg, chosen))
    assert priced.overlap is not None and astuple(priced.overlap) == pytest.approx(astuple(chosen.overlap))
    assert priced.total == pytest.approx(chosen.total, rel=1e-9)
    # An explicit one-step-off plan: its step is the overlap formula, below the stages' plain sum.
    split = load_experiment("tiny_cpu", ["placement=split_rollout", "trainer.rollout_lag=1"])
    o = plan_candidate(split, plan_placement(split))
    assert o.total == pytest.approx(max(o.overlap.generate_s, o.overlap.consume_s) + o.overlap.score_s
                                    + o.overlap.sync_s)
    assert o.total < sum(o.stage_times.values())


def test_the_printout_says_the_rollout_runs_one_step_off():
    _, explanation = search_placement(load_experiment("tiny_cpu", LAG1))
    text = explanation.format()
    assert "one step off (trainer.rollout_lag=1)" in text
    assert "rollout gen tp" in text and "GPUs of its own" in text
    assert explanation.to_json()["one_step_off"]["consume_s"] > 0


def test_lag_0_workload_and_candidates_are_unchanged():
    cfg = load_experiment("tiny_cpu", ["placement=auto"])
    assert "rollout" not in workload_from_config(cfg).role_names
    result = search_config(cfg)
    assert all(p.best.overlap is None for p in result.partitions if p.best is not None)
    assert result.chosen.total == sum(result.chosen.stage_times.values())


def test_one_gpu_is_one_clear_error(capsys):
    cfg = load_experiment("tiny_cpu", [*LAG1, "cluster.gpus_per_node=1", "data.train_batch_size=16",
                                       "algorithm.mini_batch_size=16"])
    with pytest.raises(UserError, match=r"^trainer\.rollout_lag: 1 generates on GPUs the actor does not hold, "
                                        r"but the cluster has 1 GPU; set trainer\.rollout_lag=0"):
        plan_placement(cfg)
    with pytest.raises(SystemExit) as exc:
        plan_cli.main(["+experiment=tiny_cpu", *LAG1, "cluster.gpus_per_node=1", "--out", "/dev/null"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: trainer.rollout_lag: 1 generates on GPUs the actor does not hold")


def test_vllm_at_lag_1_is_still_refused_by_check_rollout_lag():
    with pytest.raises(UserError, match=r"^trainer\.rollout_lag: 1 with rollout\.engine=vllm has never run") as e:
        plan_placement(load_experiment("tiny_cpu", [*LAG1, "rollout=vllm", "cluster=1node_4gpu"]))
    assert "placement=auto then plans its own GPUs" in str(e.value)  # not placement.resources, ignored in auto


# ---- the cost model on a hand-built workload ------------------------------------------------------------
DEVICE = DeviceSpec.from_cluster(ClusterConfig(nodes=1, gpus_per_node=8, gpu_type="A100"))


def lag1_workload(response_length: int) -> Workload:
    m = LLAMA_SHAPES["7b"]
    roles = split_rollout(ppo_roles(m, replace(m, head="value"), None))
    return Workload(roles, 64, 1, 256, response_length, 64, rollout_engine="megatron", rollout_lag=1)


def memory(wl: Workload):
    def fn(role, s):
        r = wl.role(role)
        per = 16.0 if r.trains else 2.0
        total = r.model.params * per / (s.tp * s.pp)
        return (total + 8 * GIB, 8 * GIB) if s.gen_tp else (total, 0.0)
    return fn


def _by_role(cand: Candidate, role: str):
    return next((s, c) for s in cand.sets for c in s.choices if c.role == role)


def _sync_by_hand(cand: Candidate, wl: Workload, eff: Efficiency) -> float:
    # Split reshard: a rollout GPU receives its generation shard, an actor GPU sends its training shard once
    # per generation replica it feeds; one node, so over NVLink.
    t, g = _by_role(cand, "actor")[1].strategy, _by_role(cand, "rollout")[1].strategy
    weights = wl.role("rollout").model.weight_bytes
    feeds = -(-g.gen_dp // t.dp)
    busiest = max(weights / g.gen_tp, weights / (t.tp * t.pp) * feeds)
    return busiest / (DEVICE.intra_bytes_per_s * eff.nvlink_efficiency) + eff.nvlink_latency_s


def test_long_generation_iteration_is_generation_plus_sync_not_the_sum_of_stages():
    wl, eff = lag1_workload(4096), Efficiency()
    result = search(wl, DEVICE, memory(wl), eff)
    chosen = result.chosen
    rollout_set, _ = _by_role(chosen, "rollout")
    assert set(rollout_set.roles) == {"rollout"}
    generation = rollout_set.stage_time(GENERATION)
    others = [s for s in chosen.sets if s is not rollout_set]
    consume = max(s.stage_time(PREPARATION) for s in others) + max(s.stage_time(TRAINING) for s in others)
    assert generation > consume  # the case this test is about: generation is long
    expected = max(generation, consume) + _sync_by_hand(chosen, wl, eff)
    assert chosen.total == pytest.approx(expected, rel=1e-12)
    assert chosen.total < sum(chosen.stage_times.values())  # the overlap hides preparation + training


def test_a_rollout_sharing_a_set_prepares_only_after_generating():
    # {critic, rollout}: the critic's values wait for the generation on its GPUs; the exchange then waits for
    # the slower of the two sides, and training runs concurrently on both.
    wl, eff = lag1_workload(1024), Efficiency()
    result = search(wl, DEVICE, memory(wl), eff)
    shared = next(p.best for p in result.partitions if p.best is not None
                  and {"critic", "rollout"} in [set(s) for s in p.partition] and len(p.partition) == 2)
    crit_set, _ = _by_role(shared, "rollout")
    actor_set, _ = _by_role(shared, "actor")
    by_hand = (max(crit_set.stage_time(GENERATION) + crit_set.stage_time(PREPARATION),
                   actor_set.stage_time(PREPARATION))
               + max(crit_set.stage_time(TRAINING), actor_set.stage_time(TRAINING))
               + _sync_by_hand(shared, wl, eff))
    assert shared.total == pytest.approx(by_hand, rel=1e-12)


def test_a_rollout_alone_takes_only_generation_layouts():
    wl = lag1_workload(1024)
    layouts = strategies_for(wl.role("rollout"), 4, DEVICE, wl)
    assert layouts and all(s.tp == s.gen_tp and s.pp == 1 and s.gpus == 4 for s in layouts)
    assert {s.gen_tp for s in layouts} == {1, 2, 4}


def test_a_lag_1_workload_needs_a_rollout_role():
    m = LLAMA_SHAPES["7b"]
    with pytest.raises(ValueError, match="rollout_lag=1 needs a generation-only 'rollout' role"):
        Workload(ppo_roles(m, None, None), 64, 1, 256, 256, 64, rollout_engine="vllm", rollout_lag=1)
