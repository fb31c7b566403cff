"""What each `algorithm.name` needs from the rest of the run, refused at load (plan) time in one line."""

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError


@pytest.mark.parametrize(("experiment", "overrides", "match"), [
    ("tiny_cpu", ["roles.critic.enabled=false"], r"^roles\.critic\.enabled: ppo needs a critic for GAE; "),
    ("rloo_tiny_cpu", ["roles.critic.enabled=true"], r"^roles\.critic\.enabled: rloo uses no critic"),
    ("reinforce_pp_tiny_cpu", ["roles.critic.enabled=true"], r"^roles\.critic\.enabled: reinforce_pp uses no"),
    ("rloo_tiny_cpu", ["rollout.n_samples_per_prompt=1", "algorithm.mini_batch_size=8"],
     r"^rollout\.n_samples_per_prompt: rloo compares the samples of a prompt, got 1; set it to >= 2"),
    ("gspo_tiny_cpu", ["algorithm.loss_agg_mode=token-mean"],
     r"^algorithm\.loss_agg_mode: gspo is defined with seq-mean-token-mean, got 'token-mean'; "),
    ("dr_grpo_tiny_cpu", ["algorithm.loss_agg_mode=seq-mean-token-mean"], r"^algorithm\.loss_agg_mode: dr_grpo "),
    ("dapo_tiny_cpu", ["algorithm.loss_agg_mode=seq-mean-token-sum"], r"^algorithm\.loss_agg_mode: dapo "),
    ("grpo_tiny_cpu", ["algorithm.overlong_buffer=2"], r"^algorithm\.overlong_buffer: grpo does not shape "),
    ("dapo_tiny_cpu", ["algorithm.overlong_buffer=9"],
     r"^algorithm\.overlong_buffer: 9 exceeds rollout\.max_new_tokens=8; "),
])
def test_combinations_the_algorithm_cannot_run_are_refused(experiment, overrides, match):
    with pytest.raises(UserError, match=match) as err:
        load_experiment(experiment, overrides)
    assert "\n" not in str(err.value) and "; " in str(err.value)


def test_reinforce_pp_runs_with_one_sample_per_prompt():
    cfg = load_experiment("reinforce_pp_tiny_cpu", ["rollout.n_samples_per_prompt=1", "algorithm.mini_batch_size=8"])
    assert cfg.rollout.n_samples_per_prompt == 1
