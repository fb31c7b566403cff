"""RL algorithms as pure tensor functions: advantages, KL, losses. No model, no process groups."""

from hybridflow.algorithms.advantage import Advantages
from hybridflow.algorithms.build import AdvantageEstimator, build_advantage_estimator
from hybridflow.algorithms.entropy import entropy_from_logits
from hybridflow.algorithms.gae import GAE, gae_advantages
from hybridflow.algorithms.grpo import GroupNormalized, group_normalized_scores
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
from hybridflow.algorithms.ppo_loss import ppo_policy_loss
from hybridflow.algorithms.value_loss import clipped_value_loss
from hybridflow.algorithms.whiten import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "KL_ESTIMATORS",
    "ActorLossConfig",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "Advantages",
    "CriticLossConfig",
    "FixedKLController",
    "GAE",
    "GroupNormalized",
    "KLController",
    "LossOutput",
    "actor_loss",
    "build_advantage_estimator",
    "build_kl_controller",
    "clipped_value_loss",
    "critic_loss",
    "entropy_from_logits",
    "gae_advantages",
    "group_normalized_scores",
    "kl_estimator",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalized_rewards",
    "last_token_scores",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_policy_loss",
    "sft_loss",
    "token_means",
]
