"""A user's own experiment outside the repository, as the README's "Your own experiment" shows it: an
experiment file composing the built-in groups, a prompts file beside it (a relative path) and a module of the
user's that registers an algorithm name and holds the reward function."""

from __future__ import annotations

import json
from pathlib import Path

EXPERIMENT = """\
defaults:
  - /algorithm: grpo
  - /model: tiny_llama
name: my_experiment
imports: [my_rewards]            # registers algorithm my_grpo; imported on the launcher and every rank
model: {vocab_size: 100}         # the built-in character tokenizer's ids
cluster: {gpus_per_node: 2}
roles:
  actor: {parallel: {tp: 2, pp: 1}, micro_batch_size: 8}
  critic: {enabled: false}
  rollout: {parallel: {tp: 2}}
  reward: {enabled: false}
algorithm: {name: my_grpo, mini_batch_size: 8}
rollout: {max_new_tokens: 4, n_samples_per_prompt: 2}
data:
  source: data/prompts.jsonl     # relative: next to this file
  max_prompt_length: 12
  train_batch_size: 4
  seq_length: 16
reward: {fn: my_rewards:digit_reward}
trainer: {total_steps: 2, lr: 1.0e-3}
"""

REWARDS = '''\
import dataclasses

from hybridflow.algorithms.registry import algorithm_record, register_algorithm

register_algorithm(dataclasses.replace(algorithm_record("grpo"), name="my_grpo"))


def digit_reward(batch):
    """1 for a response that starts with the row's answer."""
    return [float(r.strip().startswith(row["answer"])) for r, row in zip(batch.responses, batch.rows)]
'''


def write_user_dir(root: Path) -> Path:
    """The user's directory under `root`; returns the experiment file's path."""
    (root / "data").mkdir(parents=True)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (root / "data" / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "my_rewards.py").write_text(REWARDS)
    (root / "my_experiment.yaml").write_text(EXPERIMENT)
    return root / "my_experiment.yaml"
