"""`algorithm.name` -> the pieces of an RL algorithm; the only place the name is looked at.

Each algorithm is an advantage estimator, a policy loss, an optional reward shaping and an optional batch
filter, all small config objects built from the typed config here. What an algorithm needs from the rest of
the run (a critic, groups of samples, a loss aggregation) is stated once, in
hybridflow.config.algorithm.ALGORITHM_NEEDS (which names the same algorithms), and checked at load time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hybridflow.algorithms.advantages.gae import GAE
from hybridflow.algorithms.advantages.group_norm import GroupNormalized
from hybridflow.algorithms.advantages.reinforce_pp import ReinforcePP, ReinforcePPBaseline
from hybridflow.algorithms.advantages.rloo import LeaveOneOut
from hybridflow.algorithms.losses.gspo_clip import SequenceClip
from hybridflow.algorithms.losses.ppo_clip import TokenClip
from hybridflow.algorithms.scores.group_filter import DropUniformGroups
from hybridflow.algorithms.scores.overlong import OverlongPenalty
from hybridflow.config import ExperimentConfig
from hybridflow.errors import UserError

AdvantageEstimator = GAE | GroupNormalized | LeaveOneOut | ReinforcePP | ReinforcePPBaseline
PolicyLoss = TokenClip | SequenceClip


@dataclass(frozen=True)
class Algorithm:
    """An RL algorithm's pieces. `shaping` changes the scores before advantages (None: the scores as they
    are); `group_filter` drops groups and asks for more prompts at the start of the step (None: keep all)."""

    estimator: AdvantageEstimator
    policy_loss: PolicyLoss
    shaping: OverlongPenalty | None = None
    group_filter: DropUniformGroups | None = None


def _token_clip(cfg: ExperimentConfig) -> TokenClip:
    alg = cfg.algorithm
    return TokenClip(alg.cliprange, alg.clip_high, alg.clip_ratio_c)


def _group(cfg: ExperimentConfig) -> int:
    return cfg.rollout.n_samples_per_prompt


def _ppo(cfg: ExperimentConfig) -> Algorithm:
    alg = cfg.algorithm
    return Algorithm(GAE(gamma=alg.gamma, lam=alg.lam, whiten=alg.whiten_advantages), _token_clip(cfg))


def _grpo(cfg: ExperimentConfig) -> Algorithm:
    return Algorithm(GroupNormalized(_group(cfg)), _token_clip(cfg))


def _dr_grpo(cfg: ExperimentConfig) -> Algorithm:
    # Centred within the group but not divided by its std (Liu et al., 2025, "Understanding R1-Zero-like
    # training"); the length normalisation goes through loss_agg_mode (refused at load time if kept).
    return Algorithm(GroupNormalized(_group(cfg), scale_by_std=False), _token_clip(cfg))


def _rloo(cfg: ExperimentConfig) -> Algorithm:
    return Algorithm(LeaveOneOut(_group(cfg)), _token_clip(cfg))


def _reinforce_pp(cfg: ExperimentConfig) -> Algorithm:
    return Algorithm(ReinforcePP(gamma=cfg.algorithm.gamma), _token_clip(cfg))


def _reinforce_pp_baseline(cfg: ExperimentConfig) -> Algorithm:
    return Algorithm(ReinforcePPBaseline(_group(cfg)), _token_clip(cfg))


def _gspo(cfg: ExperimentConfig) -> Algorithm:
    alg = cfg.algorithm
    clip_high = alg.cliprange if alg.clip_high is None else alg.clip_high
    return Algorithm(GroupNormalized(_group(cfg)), SequenceClip(alg.cliprange, clip_high))


def _dapo(cfg: ExperimentConfig) -> Algorithm:
    # Clip-higher is algorithm.clip_high and the token-level loss loss_agg_mode=token-mean (conf/algorithm/dapo).
    alg = cfg.algorithm
    shaping = OverlongPenalty(cfg.rollout.max_new_tokens, alg.overlong_buffer, alg.overlong_penalty) \
        if alg.overlong_buffer else None
    return Algorithm(GroupNormalized(_group(cfg)), _token_clip(cfg), shaping,
                     DropUniformGroups(_group(cfg), alg.max_extra_draws))


ALGORITHM_BUILDERS: dict[str, Callable[[ExperimentConfig], Algorithm]] = {
    "ppo": _ppo,
    "grpo": _grpo,
    "dr_grpo": _dr_grpo,
    "rloo": _rloo,
    "reinforce_pp": _reinforce_pp,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
    "gspo": _gspo,
    "dapo": _dapo,
}


def build_algorithm(cfg: ExperimentConfig) -> Algorithm:
    """The algorithm `cfg.algorithm.name` names, from the loaded (checked) config."""
    name = cfg.algorithm.name
    if name not in ALGORITHM_BUILDERS:
        raise UserError(f"algorithm.name: unknown {name!r}; choose one of {sorted(ALGORITHM_BUILDERS)}")
    return ALGORITHM_BUILDERS[name](cfg)
