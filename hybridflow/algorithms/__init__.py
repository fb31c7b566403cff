"""RL algorithms as pure tensor functions, by concept: advantages/ (one estimator per file), losses/ (policy,
value and supervised losses, loss aggregation), kl/ (estimators, coefficient controllers), scores/ (shaping and
group filtering of per-sample scores), masked.py (masked reductions), protocols.py (what the trainer calls the
pieces with), record.py (one algorithm as one record), builtin/ (one module per algorithm) and registry.py
(`algorithm.name` -> its record). No model, no process groups."""

from hybridflow.algorithms import builtin  # noqa: F401  (each built-in module registers its algorithm)
from hybridflow.algorithms.advantages.base import Advantages
from hybridflow.algorithms.advantages.gae import GAE, gae_advantages
from hybridflow.algorithms.advantages.group_norm import GroupNormalized, group_normalized_scores
from hybridflow.algorithms.advantages.reinforce_pp import ReinforcePP, ReinforcePPBaseline, discounted_returns
from hybridflow.algorithms.advantages.rloo import LeaveOneOut, leave_one_out_scores
from hybridflow.algorithms.kl.controller import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    build_kl_controller,
    sequence_kl,
)
from hybridflow.algorithms.kl.estimators import (
    KL_ESTIMATORS,
    kl_estimator,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalized_rewards,
    last_token_scores,
)
from hybridflow.algorithms.losses import loss_agg
from hybridflow.algorithms.losses.actor_critic import (
    ActorLossConfig,
    CriticLossConfig,
    LossOutput,
    actor_loss,
    critic_loss,
    sft_loss,
    token_means,
)
from hybridflow.algorithms.losses.entropy import entropy_from_logits
from hybridflow.algorithms.losses.gspo_clip import SequenceClip, sequence_clip_loss
from hybridflow.algorithms.losses.ppo_clip import TokenClip, ppo_policy_loss
from hybridflow.algorithms.losses.value_clip import clipped_value_loss
from hybridflow.algorithms.masked import last_masked_index, masked_mean, masked_sum, masked_var, masked_whiten
from hybridflow.algorithms.protocols import AdvantageEstimator, GroupFilter, PolicyLoss, ScoreShaping
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord
from hybridflow.algorithms.registry import (
    algorithm_record,
    build_algorithm,
    check_algorithm,
    register_algorithm,
    registered_algorithms,
)
from hybridflow.algorithms.scores.group_filter import DropUniformGroups, varied_groups
from hybridflow.algorithms.scores.overlong import OverlongPenalty, overlong_penalty

__all__ = [
    "GAE",
    "KL_ESTIMATORS",
    "ActorLossConfig",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "Advantages",
    "Algorithm",
    "AlgorithmRecord",
    "CriticLossConfig",
    "DropUniformGroups",
    "FixedKLController",
    "GroupFilter",
    "GroupNormalized",
    "KLController",
    "LeaveOneOut",
    "LossOutput",
    "OverlongPenalty",
    "PolicyLoss",
    "ReinforcePP",
    "ReinforcePPBaseline",
    "ScoreShaping",
    "SequenceClip",
    "TokenClip",
    "actor_loss",
    "algorithm_record",
    "build_algorithm",
    "build_kl_controller",
    "check_algorithm",
    "sequence_kl",
    "clipped_value_loss",
    "critic_loss",
    "discounted_returns",
    "entropy_from_logits",
    "gae_advantages",
    "group_normalized_scores",
    "kl_estimator",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalized_rewards",
    "last_token_scores",
    "leave_one_out_scores",
    "loss_agg",
    "last_masked_index",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "ppo_policy_loss",
    "register_algorithm",
    "registered_algorithms",
    "sequence_clip_loss",
    "sft_loss",
    "token_means",
    "varied_groups",
]
