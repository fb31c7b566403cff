import pytest

from hybridflow.algorithms import (
    ALGORITHM_BUILDERS,
    GAE,
    DropUniformGroups,
    GroupNormalized,
    LeaveOneOut,
    OverlongPenalty,
    ReinforcePP,
    ReinforcePPBaseline,
    SequenceClip,
    TokenClip,
    build_algorithm,
)
from hybridflow.config import load_experiment
from hybridflow.config.algorithm import ALGORITHM_NEEDS, ALGORITHMS
from hybridflow.errors import UserError


def test_registry_and_config_name_the_same_algorithms_and_agree_on_the_critic():
    assert set(ALGORITHM_BUILDERS) == set(ALGORITHMS)
    for name in ALGORITHMS:
        experiment = "tiny_cpu" if ALGORITHM_NEEDS[name].critic else "grpo_tiny_cpu"
        algorithm = build_algorithm(load_experiment(experiment, [f"algorithm={name}"]))
        # GAE is the one estimator that reads a critic's values; config's `critic` is the only statement of it
        assert isinstance(algorithm.estimator, GAE) == ALGORITHM_NEEDS[name].critic, name


@pytest.mark.parametrize(("name", "estimator", "policy"), [
    ("ppo", GAE(1.0, 0.95, True), TokenClip(0.2)),
    ("grpo", GroupNormalized(4), TokenClip(0.2)),
    ("dr_grpo", GroupNormalized(4, scale_by_std=False), TokenClip(0.2)),
    ("rloo", LeaveOneOut(4), TokenClip(0.2)),
    ("reinforce_pp", ReinforcePP(1.0), TokenClip(0.2)),
    ("reinforce_pp_baseline", ReinforcePPBaseline(4), TokenClip(0.2)),
    ("gspo", GroupNormalized(4), SequenceClip(3e-4, 4e-4)),
    ("dapo", GroupNormalized(4), TokenClip(0.2, 0.28)),
])
def test_each_name_builds_its_pieces(name, estimator, policy):
    experiment = "tiny_cpu" if name == "ppo" else f"{name}_tiny_cpu"
    algorithm = build_algorithm(load_experiment(experiment, []))
    assert (algorithm.estimator, algorithm.policy_loss) == (estimator, policy)
    assert (algorithm.group_filter is not None) == (algorithm.shaping is not None) == (name == "dapo")


def test_dapo_shaping_and_filter_follow_the_config():
    algorithm = build_algorithm(load_experiment("dapo_tiny_cpu", []))
    assert algorithm.shaping == OverlongPenalty(max_length=8, buffer=4, penalty=1.0)
    assert algorithm.group_filter == DropUniformGroups(group_size=4, max_extra_draws=2)
    assert build_algorithm(load_experiment("dapo_tiny_cpu", ["algorithm.overlong_buffer=0"])).shaping is None


def test_unknown_name_lists_the_choices():
    cfg = load_experiment("grpo_tiny_cpu", [])
    cfg.algorithm.name = "a2c"  # past the load-time check, as an API caller could
    with pytest.raises(UserError, match=r"^algorithm\.name: unknown 'a2c'; choose one of \['dapo', "):
        build_algorithm(cfg)
