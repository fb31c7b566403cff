"""The planner's grpo_smollm2 step (SmolLM2-135M, one H200) against the measured one (1.97 s, 2026-12-04,
benchmarks/results/smollm2_h200_20261204/; stage means: generate 0.87, ref 0.22, old log-probs 0.22, update
0.62 s): each pass of a 135M model costs its micro-batches' host time, not its math."""

import pytest

from hybridflow.placement import plan_placement
from hybridflow.placement.auto.device import efficiency_for
from hybridflow.placement.auto.from_config import plan_candidate, workload_from_config
from hybridflow.resolve import resolve_experiment

MEASURED_STEP_S = 1.97
MEASURED_FORWARD_PASS_S = 0.22  # ref and old log-probs alike: 256 samples in 4 micro-batches of 64 rows
MEASURED_UPDATE_S = 0.62
# the recipe as it ran then: pi_old recomputed every step, eager log-prob kernels, micro-batches of 64 rows
MEASURED_SETTINGS = ["algorithm.old_logprobs=actor", "trainer.parity_every=1", "trainer.compile_logprobs=false",
                     "roles.actor.forward_max_tokens=16384", "roles.actor.update_max_tokens=null"]


def _predicted(overrides=MEASURED_SETTINGS):
    cfg = resolve_experiment("grpo_smollm2", list(overrides))
    return cfg, plan_candidate(cfg, plan_placement(cfg))


def _stage(candidate, role: str, stage: str) -> float:
    return next(c for s in candidate.sets for c in s.choices if c.role == role).stage_times[stage]


def test_forward_passes_cost_their_micro_batches_host_time():
    _, candidate = _predicted()
    pass_overhead = efficiency_for("H200").role_pass_overhead_s
    assert _stage(candidate, "ref", "preparation") - pass_overhead == pytest.approx(MEASURED_FORWARD_PASS_S,
                                                                                      rel=0.1)


def test_grpo_smollm2_step_within_20_percent_of_the_measured_one():
    # 2.22 s predicted (2026-12-05): the fixed per-pass time fitted over the 1B and 135M runs puts each
    # SmolLM2 forward pass at 0.44 s (0.22 measured), generation at 0.69 (0.87): the step's errors offset
    _, candidate = _predicted()
    assert candidate.total == pytest.approx(MEASURED_STEP_S, rel=0.2)
    assert _stage(candidate, "actor", "training") == pytest.approx(MEASURED_UPDATE_S, rel=0.1)


def test_pi_old_from_the_rollout_costs_the_actor_pass_on_parity_steps_only():
    """grpo_smollm2 takes pi_old from the native engine and recomputes it every 10th step (the parity gate), so the
    actor's preparation is a tenth of a pass per step on average; recomputed every step it is a whole one."""
    passes = {tuple(o): workload_from_config(resolve_experiment("grpo_smollm2", o)).role("actor").preparation_passes
              for o in ([], ["trainer.parity_every=0"], ["algorithm.old_logprobs=actor"])}
    assert list(passes.values()) == [pytest.approx(0.1), 0.0, 1.0]
    (_, rollout), (_, actor) = _predicted([]), _predicted(["algorithm.old_logprobs=actor"])
    overhead = efficiency_for("H200").role_pass_overhead_s  # paid per stage, whatever its passes
    one_pass = _stage(actor, "actor", "preparation") - overhead
    assert _stage(rollout, "actor", "preparation") - overhead == pytest.approx(one_pass / 10)
