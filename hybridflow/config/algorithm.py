"""RL algorithm hyper-parameters. What each `algorithm.name` is and needs from the rest of the run is its
record's (hybridflow/algorithms/registry.py), checked before planning."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.bounds import bounded
from hybridflow.role_records import Role

KL_CONTROLLERS = ("fixed", "adaptive")
# hybridflow.algorithms.kl.estimators.KL_ESTIMATORS has exactly these keys (a test checks it; config imports nothing).
KL_ESTIMATOR_NAMES = ("k1", "k2", "k3")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
OLD_LOGPROB_SOURCES = (Role.ACTOR, Role.ROLLOUT)  # the role whose log-probs are pi_old



@dataclass
class AlgorithmConfig:
    name: str = "ppo"  # a registered algorithm (hybridflow.algorithms: register_algorithm), checked before planning
    gamma: float = bounded(1.0, ge=0, le=1)
    lam: float = bounded(0.95, ge=0, le=1)
    cliprange: float = bounded(0.2, gt=0, le=1)
    # Upper clip 1 + clip_high; None: symmetric (= cliprange). DAPO's clip-higher raises it (e.g. 0.28).
    clip_high: float | None = bounded(None, gt=0, le=10)
    # Dual-clip PPO (Ye et al., 2020): for negative advantages the loss is capped at -A * clip_ratio_c, so a
    # huge ratio cannot dominate the batch; None: off. Usual value 3.0.
    clip_ratio_c: float | None = bounded(None, gt=1)
    # Truncated importance sampling: the policy loss of each token is weighted by min(pi_old / pi_rollout, C)
    # (pi_old: the actor's log-probs before the update; pi_rollout: the engine's, stale at trainer.rollout_lag=1
    # or of another numeric precision); C = tis_cap, 0 = off. Usual value 2.0.
    tis_cap: float = bounded(0.0, ge=0)
    # Where the PPO ratio's pi_old comes from. "actor": the actor recomputes the sampled tokens' log-probs before
    # the update (a forward pass over the whole batch). "rollout": the engine's own log-probs of the tokens it
    # sampled, i.e. the behaviour policy itself; the actor recomputes only on the parity gate's steps
    # (trainer.parity_every), and those steps use the recomputed values. One forward pass per step less; worth it
    # where the engine matches the actor (the native engine: max |dlogp| ~1e-6 in bf16), while with vLLM's kernels
    # the ratio then also carries the engines' numeric difference (truncated IS is then meaningless: refused).
    old_logprobs: str = bounded(Role.ACTOR, choices=OLD_LOGPROB_SOURCES)
    cliprange_value: float = bounded(0.2, gt=0)
    kl_coef: float = bounded(0.05, ge=0)
    kl_controller: str = bounded("fixed", choices=KL_CONTROLLERS)
    kl_target: float = bounded(6.0, gt=0)
    kl_horizon: int = bounded(10000, ge=1)
    kl_in_reward: bool = True  # True: KL penalty in the reward (PPO); False: KL loss term (GRPO style)
    kl_estimator: str = bounded("k1", choices=KL_ESTIMATOR_NAMES)  # per-token KL in the reward
    kl_loss_estimator: str = bounded("k3", choices=KL_ESTIMATOR_NAMES)  # per-token KL as a loss term
    entropy_coef: float = bounded(0.0, ge=0)
    whiten_advantages: bool = True
    ppo_epochs: int = bounded(1, ge=1)
    # How token losses become the mini-batch's loss (hybridflow/algorithms/losses/loss_agg.py); independent of the
    # micro-batch size and DP in every mode.
    loss_agg_mode: str = bounded("token-mean", choices=LOSS_AGG_MODES)
    # DAPO's over-long shaping: the last `overlong_buffer` tokens before rollout.max_new_tokens cost up to
    # `overlong_penalty` reward, linearly (hybridflow/algorithms/scores/overlong.py); 0 = off.
    overlong_buffer: int = bounded(0, ge=0)
    overlong_penalty: float = bounded(1.0, ge=0)
    # DAPO's dynamic sampling: at most this many more prompt batches are generated per step to replace the
    # groups whose samples all scored the same (then the batch is topped up with such groups; metrics say so).
    max_extra_draws: int = bounded(4, ge=0)
    # Samples (prompt x response) per optimizer step; must divide train_batch_size * n_samples_per_prompt.
    mini_batch_size: int = bounded(8, ge=1)
    # Cut mini-batches from a permutation of the step's samples (drawn from trainer.seed, the step and the PPO
    # epoch: the same on every rank, and after a resume with the same trainer.seed), as TRL's GRPOTrainer does (it
    # shuffles once per generation batch and keeps that split for every iteration), so an optimizer step mixes the
    # prompts' groups. False: mini-batches in batch order, i.e. whole prompt groups (verl's default).
    shuffle_mini_batches: bool = False
