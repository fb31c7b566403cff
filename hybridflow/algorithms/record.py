"""One RL algorithm as one record: how to build its pieces from the config and what it needs from the run.

A record carries its name and is registered with `register_algorithm(record)`, by its own module under
`hybridflow/algorithms/builtin/` or by user code; nothing else looks at `algorithm.name`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hybridflow.algorithms.kl.estimators import KLEstimator, kl_estimator
from hybridflow.algorithms.losses.ppo_clip import TokenClip
from hybridflow.algorithms.protocols import AdvantageEstimator, GroupFilter, PolicyLoss, ScoreShaping
from hybridflow.config import ExperimentConfig
from hybridflow.config.algorithm import LOSS_AGG_MODES


@dataclass(frozen=True)
class Algorithm:
    """An algorithm's pieces, built for one run.

    `shaping` changes the scores before advantages (None: the scores as they are); `group_filter` drops
    groups and asks for more prompts at the start of the step (None: keep all). `reward_kl` is the per-token
    KL estimator of the penalty in the reward (None: KL as a loss term, or none); `tis_cap` > 0 weights each
    token's policy loss by min(pi_old / pi_rollout, tis_cap) (truncated importance sampling; 0: off).
    """

    estimator: AdvantageEstimator
    policy_loss: PolicyLoss
    shaping: ScoreShaping | None = None
    group_filter: GroupFilter | None = None
    reward_kl: KLEstimator | None = None
    tis_cap: float = 0.0


@dataclass(frozen=True)
class AlgorithmRecord:
    """What one `algorithm.name` is: its builder and the facts the run is checked against before planning."""

    name: str  # `algorithm.name`
    build: Callable[[ExperimentConfig], Algorithm]
    critic: bool  # reads a critic's values (GAE); a critic-free one refuses an enabled critic (it would idle)
    groups: bool  # compares the n samples of a prompt: rollout.n_samples_per_prompt >= 2
    loss_agg_modes: tuple[str, ...] = LOSS_AGG_MODES  # the aggregations the algorithm is defined with
    shapes_overlong: bool = False  # reads algorithm.overlong_buffer
    dual_clip: bool = True  # reads algorithm.clip_ratio_c (a per-token clip; GSPO's is per sequence)


def with_reward_side(cfg: ExperimentConfig, estimator: AdvantageEstimator, policy_loss: PolicyLoss,
                     shaping: ScoreShaping | None = None, group_filter: GroupFilter | None = None) -> Algorithm:
    """The pieces, with the reward-side ones as the config sets them (`algorithm.kl_in_reward`,
    `algorithm.kl_estimator`, `algorithm.tis_cap`)."""
    alg = cfg.algorithm
    reward_kl = kl_estimator(alg.kl_estimator) if alg.kl_in_reward else None
    return Algorithm(estimator, policy_loss, shaping, group_filter, reward_kl, alg.tis_cap)


def token_clip(cfg: ExperimentConfig) -> TokenClip:
    """PPO's per-token clipped surrogate from `algorithm.cliprange`, `clip_high`, `clip_ratio_c`."""
    alg = cfg.algorithm
    return TokenClip(alg.cliprange, alg.clip_high, alg.clip_ratio_c)


def group_size(cfg: ExperimentConfig) -> int:
    """Samples per prompt: the group a group-relative estimator compares."""
    return cfg.rollout.n_samples_per_prompt
