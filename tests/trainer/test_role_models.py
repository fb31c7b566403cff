"""Critic and reward model from their own configs and checkpoints: a critic of another shape than the actor
trains end to end on CPU, a reward model scores from its own sequence-classification checkpoint, and a
different vocabulary is refused up front."""

from __future__ import annotations

import math

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from tests.trainer.run_helpers import rl_records, run

# Half the actor's width and depth (tiny_llama: h=128, 4 layers): values are per token, so any shape fits.
CRITIC = ("+model@critic_model=tiny_llama", "critic_model.hidden_size=64", "critic_model.intermediate_size=96",
          "critic_model.num_hidden_layers=2")


def test_a_critic_with_another_vocabulary_is_refused():
    with pytest.raises(UserError, match=r"^critic_model\.vocab_size: 32 differs from model\.vocab_size=17"):
        load_experiment("tiny_cpu", [*CRITIC, "critic_model.vocab_size=32"])


def test_a_sequence_classification_policy_is_refused():
    with pytest.raises(UserError, match=r"^model\.architecture: the policy 'LlamaForSequenceClassification'"):
        load_experiment("tiny_cpu", ["model.architecture=LlamaForSequenceClassification"])


def _reward_checkpoint(path):
    """A tiny Llama reward model (HF sequence classification, a `score` head) over the policy's 17 ids."""
    from tests.megatron_adapters.tiny_hf_models import save_tiny_model

    save_tiny_model("llama", path, seed=3, head="score", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=17)


@pytest.mark.slow
def test_own_critic_and_reward_model_train_end_to_end(tmp_path):
    _reward_checkpoint(tmp_path / "rm")
    reward = ("+model@reward_model=tiny_llama", f"reward_model.path={tmp_path / 'rm'}")
    cfg = load_experiment("tiny_cpu", [*CRITIC, *reward])
    assert cfg.critic_model.hidden_size == 64 and cfg.reward_model.hidden_size == 32
    out = tmp_path / "run"
    result = run(out, *CRITIC, *reward, "roles.reward.enabled=true", "reward.use_model=true",
        "data.train_batch_size=16", "algorithm.mini_batch_size=16", "roles.actor.micro_batch_size=8",
        "roles.critic.micro_batch_size=4", "trainer.total_steps=3", "trainer.warmup_sft_steps=0",
        "trainer.save_every=0")
    records = rl_records(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["critic/vf_loss"]) for r in records)
    values = [r["critic/values"] for r in records]
    assert len(set(values)) == 3, values  # the critic trains: its values move step to step
    # Scores come from the reward model's own head: real-valued, not the 0/1 of the task's rule.
    scores = [r["reward/mean"] for r in records]
    assert all(math.isfinite(s) for s in scores) and any(s not in (0.0, 1.0) for s in scores), scores
    assert (out / "init_critic_model" / "config.json").exists()  # built from its own shape, not the policy's
    # The run's header, and megatron-core's per-build deprecation said once instead of once per model per rank.
    assert result.stdout.startswith("hybridflow run: experiment tiny_cpu\n  plan:   4 GPUs"), result.stdout
    assert f"  output: {out.resolve()}\n" in result.stdout
    assert "IS DEPRECATED" not in result.stderr and result.stderr.count("GPTModel deprecated") == 1
