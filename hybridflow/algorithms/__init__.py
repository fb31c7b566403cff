"""RL algorithms as pure tensor functions: advantages, KL, losses. No model, no process groups."""

from hybridflow.algorithms.advantage import Advantages
from hybridflow.algorithms.entropy import entropy_from_logits
from hybridflow.algorithms.gae import GAE, gae_advantages
from hybridflow.algorithms.group_filter import DropUniformGroups, varied_groups
from hybridflow.algorithms.grpo import GroupNormalized, group_normalized_scores
from hybridflow.algorithms.gspo_loss import SequenceClip, sequence_clip_loss
from hybridflow.algorithms.kl import (
    KL_ESTIMATORS,
    kl_estimator,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalized_rewards,
    last_token_scores,
)
from hybridflow.algorithms.kl_controller import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    build_kl_controller,
)
from hybridflow.algorithms.losses import (
    ActorLossConfig,
    CriticLossConfig,
    LossOutput,
    actor_loss,
    critic_loss,
    sft_loss,
    token_means,
)
from hybridflow.algorithms.overlong import OverlongPenalty, overlong_penalty
from hybridflow.algorithms.ppo_loss import TokenClip, ppo_policy_loss
from hybridflow.algorithms.registry import (
    ALGORITHM_BUILDERS,
    AdvantageEstimator,
    Algorithm,
    PolicyLoss,
    build_algorithm,
)
from hybridflow.algorithms.reinforce_pp import ReinforcePP, ReinforcePPBaseline, discounted_returns
from hybridflow.algorithms.rloo import LeaveOneOut, leave_one_out_scores
from hybridflow.algorithms.value_loss import clipped_value_loss
from hybridflow.algorithms.whiten import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ALGORITHM_BUILDERS",
    "GAE",
    "KL_ESTIMATORS",
    "ActorLossConfig",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "Advantages",
    "Algorithm",
    "CriticLossConfig",
    "DropUniformGroups",
    "FixedKLController",
    "GroupNormalized",
    "KLController",
    "LeaveOneOut",
    "LossOutput",
    "OverlongPenalty",
    "PolicyLoss",
    "ReinforcePP",
    "ReinforcePPBaseline",
    "SequenceClip",
    "TokenClip",
    "actor_loss",
    "build_algorithm",
    "build_kl_controller",
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
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "ppo_policy_loss",
    "sequence_clip_loss",
    "sft_loss",
    "token_means",
    "varied_groups",
]
