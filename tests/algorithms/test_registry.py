import dataclasses
import importlib.util

import pytest

from hybridflow.algorithms import (
    GAE,
    DropUniformGroups,
    GroupNormalized,
    LeaveOneOut,
    OverlongPenalty,
    ReinforcePP,
    ReinforcePPBaseline,
    SequenceClip,
    TokenClip,
    algorithm_record,
    build_algorithm,
    kl_k1,
    register_algorithm,
    registered_algorithms,
)
from hybridflow.algorithms.record import AlgorithmRecord, token_clip, with_reward_side
from hybridflow.config import conf_dir, load_experiment
from hybridflow.errors import UserError


def _builtin_algorithms() -> list[str]:
    """The package's own records (tests that import a user's module in this process may have added theirs)."""
    return [n for n in registered_algorithms() if importlib.util.find_spec(f"hybridflow.algorithms.builtin.{n}")]


def test_every_algorithm_has_a_conf_option_and_its_record_agrees_on_the_critic():
    assert set(_builtin_algorithms()) == {p.stem for p in (conf_dir() / "algorithm").glob("*.yaml")}
    for name in _builtin_algorithms():
        critic = algorithm_record(name).critic
        experiment = "tiny_cpu" if critic else "grpo_tiny_cpu"
        algorithm = build_algorithm(load_experiment(experiment, [f"algorithm={name}"]))
        # GAE is the one estimator that reads a critic's values; the record's `critic` is the only statement of it
        assert isinstance(algorithm.estimator, GAE) == critic, name


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
    cfg.algorithm.name = "a2c"
    with pytest.raises(UserError, match=r"^algorithm\.name: 'a2c' is unknown; use one of dapo, dr_grpo, "):
        build_algorithm(cfg)


def test_reward_side_pieces_follow_the_config():
    ppo = build_algorithm(load_experiment("tiny_cpu", ["algorithm.tis_cap=2.0"]))
    assert (ppo.reward_kl, ppo.tis_cap) == (kl_k1, 2.0)  # conf/algorithm/ppo: KL in the reward, k1
    grpo = build_algorithm(load_experiment("grpo_tiny_cpu", []))
    assert (grpo.reward_kl, grpo.tis_cap) == (None, 0.0)  # conf/algorithm/grpo: KL as a loss term


def test_a_registered_record_is_checked_and_built_by_its_name(monkeypatch):
    import hybridflow.algorithms.registry as registry

    # leave the real table as it was
    monkeypatch.setattr(registry._ALGORITHMS, "_records", dict(registry._ALGORITHMS._records))
    built = dataclasses.replace(build_algorithm(load_experiment("grpo_tiny_cpu", [])), group_filter=None)

    def build(cfg):
        return with_reward_side(cfg, GroupNormalized(2), token_clip(cfg))

    register_algorithm(AlgorithmRecord("pairwise", build, critic=False, groups=True, loss_agg_modes=("token-mean",)))
    cfg = load_experiment("grpo_tiny_cpu", [])
    cfg.algorithm.name = "pairwise"
    assert build_algorithm(cfg) == dataclasses.replace(built, estimator=GroupNormalized(2))
    cfg.algorithm.loss_agg_mode = "seq-mean-token-sum"
    with pytest.raises(UserError, match=r"^algorithm\.loss_agg_mode: pairwise is defined with token-mean, "):
        build_algorithm(cfg)
    with pytest.raises(ValueError, match="registered already"):
        register_algorithm(AlgorithmRecord("pairwise", build, critic=True, groups=False))
