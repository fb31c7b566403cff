"""RL algorithm hyper-parameters (PPO, GRPO)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.bounds import bounded

ALGORITHMS = ("ppo", "grpo")
KL_CONTROLLERS = ("fixed", "adaptive")


@dataclass
class AlgorithmConfig:
    name: str = bounded("ppo", choices=ALGORITHMS)
    gamma: float = bounded(1.0, ge=0, le=1)
    lam: float = bounded(0.95, ge=0, le=1)
    cliprange: float = bounded(0.2, gt=0, le=1)
    cliprange_value: float = bounded(0.2, gt=0)
    kl_coef: float = bounded(0.05, ge=0)
    kl_controller: str = bounded("fixed", choices=KL_CONTROLLERS)
    kl_target: float = bounded(6.0, gt=0)
    kl_horizon: int = bounded(10000, ge=1)
    kl_in_reward: bool = True  # True: KL penalty in the reward (PPO); False: KL loss term (GRPO style)
    entropy_coef: float = bounded(0.0, ge=0)
    whiten_advantages: bool = True
    ppo_epochs: int = bounded(1, ge=1)
    # Samples (prompt x response) per optimizer step; must divide train_batch_size * n_samples_per_prompt.
    mini_batch_size: int = bounded(8, ge=1)
