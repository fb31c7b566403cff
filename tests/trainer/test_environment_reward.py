"""An environment's reward (EnvironmentStep.reward) scores its trajectory in place of `reward.fn`: it travels
from the turn loop (Episode.stats' last column) into the batch (`env_rewards`, NaN where none) and the
scorer's shared scores take it where it is given; trajectories without one keep the reward function's score."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.data.step_batch import StepBatch, concat_batches
from hybridflow.rollout.turns import environment_rewards, run_turns, turn_metrics
from hybridflow.tools import EnvironmentStep, ToolEnvironment
from hybridflow.trainer.scorer import Scorer
from tests.rollout.test_turns import SCRIPTS, ScriptedSampler, _episodes, _settings
from tests.tools.chat_tokenizers import qwen_style_tokenizer


@dataclass(frozen=True)
class GradingCalculator(ToolEnvironment):
    """The calculator environment that grades the episodes of even-numbered questions itself: 0.5 after
    each tool turn and, at the end, 1.0 when the last turn answers 900 (else 0.0); odd ones it leaves to
    the reward function."""

    def step(self, messages: list[dict[str, str]], row: Mapping[str, Any]) -> EnvironmentStep:
        step = super().step(messages, row)
        if int(row["prompt_messages"][-1]["content"].split()[-1]) % 2:
            return step
        reward = (1.0 if "#### 900" in messages[-1]["content"] else 0.0) if step.done else 0.5
        return EnvironmentStep(step.messages, step.done, reward, step.metrics)


def _rollout_columns(tmp_path) -> torch.Tensor:
    tok = qwen_style_tokenizer(tmp_path)
    settings = _settings(tok, environment=GradingCalculator(name="grading", tools=("calculator",)))
    episodes = _episodes(tok, settings)
    run_turns(episodes, ScriptedSampler(tok, episodes), settings)
    return torch.tensor([e.stats() for e in episodes])


def test_the_environments_last_reward_travels_with_the_trajectory(tmp_path):
    rewards = environment_rewards(_rollout_columns(tmp_path))
    # question 0 ends on "#### 900" after two tool turns (their 0.5s are replaced); 2 ends on "#### 1"
    assert rewards[0] == 1.0 and rewards[2] == 0.0
    assert math.isnan(rewards[1]) and math.isnan(rewards[3])
    metrics = turn_metrics(_rollout_columns(tmp_path))
    assert metrics["turns/env_rewarded"] == 0.5
    assert metrics["tools/calling_share"] == sum("<tool_call>" in s[0] for s in SCRIPTS) / len(SCRIPTS)


def _batch(env_rewards: torch.Tensor | None) -> StepBatch:
    n = 4
    return StepBatch(rows=[{}] * n, tokens=torch.ones(n, 3, dtype=torch.long), prompt_lens=torch.ones(n),
                     env_rewards=env_rewards)


def test_the_scorer_takes_the_environments_reward_over_the_reward_function(tmp_path):
    fn_scores = torch.tensor([0.25, 0.25, 0.25, 0.25])
    scorer = Scorer(lambda batch: fn_scores.clone(), lambda local, batch: local)
    batch = _batch(environment_rewards(_rollout_columns(tmp_path)))
    assert scorer.share(scorer.local(batch), batch).tolist() == [1.0, 0.25, 0.0, 0.25]
    # single turn (no environment): the reward function's scores as they are
    assert scorer.share(scorer.local(_batch(None)), _batch(None)).tolist() == fn_scores.tolist()
    # the rewards follow their rows when a batch filter selects and joins batches
    joined = concat_batches([batch.select(torch.tensor([2, 1])), batch.select(torch.tensor([0]))])
    assert scorer.share(fn_scores[:3].clone(), joined).tolist() == [0.0, 0.25, 1.0]
