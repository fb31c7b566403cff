"""One-step-off asynchronous rollout end to end on CPU (`trainer.rollout_lag=1`, rollout on ranks 2-3, every
other role on 0-1): the reward rises, the samples really come from the weights one update old, and a run
killed after step 3 resumes bit for bit (the batch generated before the checkpoint is restored with it).
`placement=auto` at lag 1 runs the plan its search picks (the rollout on GPUs the actor does not hold).
"""

from __future__ import annotations

import pytest

from tests.trainer.run_helpers import algorithmic, kill_after_step, rl_records, run, start
from tests.trainer.test_train_e2e import AUTO, QUICK, _rise

pytestmark = pytest.mark.slow

LAG1 = ("placement=split_rollout", "trainer.rollout_lag=1")


def test_reward_rises_with_the_rollout_one_step_behind(tmp_path):
    # tiny_cpu's own batch (32 prompts), as the lag-0 test_ppo_reward_rises.
    run(tmp_path, *LAG1, "trainer.total_steps=20")
    records = rl_records(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 21))
    first, last = _rise(records, 5)
    assert last > first + 0.15, (first, last)
    # Step 1 trains on the batch primed with its own weights; from step 2 on the batch was sampled by the
    # weights before the last update, so the actor's recomputed log-probs differ from the rollout's.
    assert records[0]["offpolicy/max_abs"] <= 1e-4
    assert all(r["offpolicy/max_abs"] > 1e-3 for r in records[1:]), [r["offpolicy/max_abs"] for r in records]
    assert all("parity/max_abs" not in r for r in records)
    assert all("critic/vf_loss" in r and "actor/pg_loss" in r and "rollout/generate_s" in r for r in records)


def test_auto_placement_at_lag_1_runs_its_plan(tmp_path):
    from hybridflow.config import load_experiment
    from hybridflow.placement import plan_placement

    plan = plan_placement(load_experiment("tiny_cpu", [*AUTO, "trainer.rollout_lag=1"]))
    assert not set(plan.meshes["actor"].ranks) & set(plan.meshes["rollout"].ranks), plan.meshes
    run(tmp_path, "+experiment=tiny_cpu", *AUTO, "trainer.rollout_lag=1", "trainer.total_steps=2",
        "trainer.save_every=0")
    records = rl_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert all("critic/vf_loss" in r and "actor/pg_loss" in r and "rollout/generate_s" in r for r in records)
    # Step 2 trained on samples of the weights before update 1: the lag really was one step.
    assert records[1]["offpolicy/max_abs"] > 1e-3 and "parity/max_abs" not in records[1]


@pytest.fixture(scope="module")
def killed_and_resumed_at_lag_1(tmp_path_factory):
    """As test_train_e2e's killed_and_resumed, at lag 1 with truncated IS on: {step: algorithmic metrics}."""
    root = tmp_path_factory.mktemp("resume_lag1")
    common = (*QUICK, *LAG1, "algorithm.tis_cap=2.0", "trainer.total_steps=4", "trainer.save_every=2",
              "trainer.warmup_sft_steps=2")
    straight, resumed = root / "straight", root / "resumed"
    run(straight, *common)
    proc = start(resumed, *common)
    kill_after_step(proc, resumed, step=3)
    assert (resumed / "checkpoints" / "step_000002").is_dir()
    run(resumed, *common, "trainer.resume=auto")
    expected = {r["step"]: algorithmic(r) for r in rl_records(straight)}
    got = {r["step"]: algorithmic(r) for r in rl_records(resumed)}
    return expected, got


def test_resume_at_lag_1_matches_the_uninterrupted_run(killed_and_resumed_at_lag_1):
    expected, got = killed_and_resumed_at_lag_1
    # Step 3 trains on the batch generated during step 2 by the weights of step 1, which only the
    # checkpoint still has; step 4's batch is generated after the resume.
    assert got[3] == expected[3]
    assert got[4] == expected[4]
    assert "actor/is_weight" in got[3] and got[3]["offpolicy/max_abs"] > 0
