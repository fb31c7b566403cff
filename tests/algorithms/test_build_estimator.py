import pytest

from hybridflow.algorithms import GAE, GroupNormalized, build_advantage_estimator
from hybridflow.errors import UserError


def test_estimator_per_algorithm():
    ppo = build_advantage_estimator("ppo", gamma=0.99, lam=0.9, whiten=False, group_size=1)
    assert ppo == GAE(gamma=0.99, lam=0.9, whiten=False) and ppo.needs_values
    grpo = build_advantage_estimator("grpo", gamma=1.0, lam=1.0, whiten=True, group_size=4)
    assert grpo == GroupNormalized(group_size=4) and not grpo.needs_values


@pytest.mark.parametrize(
    ("name", "group", "field"), [("grpo", 1, "rollout.n_samples_per_prompt"), ("a2c", 4, "algorithm.name")]
)
def test_bad_choices(name, group, field):
    with pytest.raises(UserError, match=field):
        build_advantage_estimator(name, gamma=1.0, lam=1.0, whiten=True, group_size=group)


def test_grpo_std_normalisation_can_be_switched_off():
    grpo = build_advantage_estimator("grpo", gamma=1.0, lam=1.0, whiten=True, group_size=2, scale_by_std=False)
    assert grpo == GroupNormalized(group_size=2, scale_by_std=False)
