"""RL algorithm hyper-parameters (PPO, GRPO)."""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("ppo", "grpo")
KL_CONTROLLERS = ("fixed", "adaptive")


@dataclass
class AlgorithmConfig:
    name: str = "ppo"  # "ppo" | "grpo"
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    kl_coef: float = 0.05
    kl_controller: str = "fixed"  # "fixed" | "adaptive"
    kl_target: float = 6.0
    kl_horizon: int = 10000
    kl_in_reward: bool = True  # True: KL penalty in the reward (PPO); False: KL loss term (GRPO style)
    entropy_coef: float = 0.0
    whiten_advantages: bool = True
    ppo_epochs: int = 1
    # Samples (prompt x response) per optimizer step; must divide train_batch_size * n_samples_per_prompt.
    mini_batch_size: int = 8
