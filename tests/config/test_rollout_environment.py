"""rollout.environment / max_turns / max_tool_tokens: names checked against the environment registry, and a
multi-turn trajectory's budget (data.seq_length) is what the sample-length rules and the planner's packed
micro-batch shape use."""

from __future__ import annotations

import pytest

from hybridflow.config import load_experiment
from hybridflow.config.experiment import longest_sample
from hybridflow.errors import UserError
from hybridflow.placement.memory import micro_batch_shape


def test_single_turn_is_the_default():
    cfg = load_experiment("tiny_cpu", [])
    assert cfg.rollout.environment is None
    assert longest_sample(cfg) == cfg.data.max_prompt_length + cfg.rollout.max_new_tokens < cfg.data.seq_length


def test_environment_names_a_registered_one():
    cfg = load_experiment("tiny_cpu", ["rollout.environment=calculator", "rollout.max_turns=3"])
    assert (cfg.rollout.environment, cfg.rollout.max_turns) == ("calculator", 3)
    assert longest_sample(cfg) == cfg.data.seq_length


def test_unknown_environment_is_one_line_listing_the_known():
    with pytest.raises(UserError, match=r"^rollout.environment: 'nope' is unknown; use one of .*calculator"):
        load_experiment("tiny_cpu", ["rollout.environment=nope"])


@pytest.mark.parametrize("override", ["rollout.max_turns=0", "rollout.max_tool_tokens=0"])
def test_turn_limits_are_positive(override):
    with pytest.raises(UserError, match=override.split("=")[0]):
        load_experiment("tiny_cpu", [override])


def test_packing_budget_must_hold_a_whole_trajectory():
    # tiny_cpu: seq_length 32, the single-turn sample 16 + 8 = 24 tokens fits a 24-token budget...
    load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=24"])
    # ...a trajectory may fill all 32
    with pytest.raises(UserError, match=r"roles.actor.max_tokens_per_micro_batch: 24 .*data.seq_length .* = 32"):
        load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=24", "rollout.environment=calculator"])


def test_planner_packs_trajectories_at_the_budget():
    single = load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=64"])
    multi = load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=64",
                                         "rollout.environment=calculator"])
    assert micro_batch_shape(single, "actor", dp=1).attention_span == 24
    assert micro_batch_shape(multi, "actor", dp=1).attention_span == 32
