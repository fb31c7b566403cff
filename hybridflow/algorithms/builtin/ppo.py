"""PPO (Schulman et al., 2017) with GAE over a critic's values and the per-token clipped surrogate."""

from hybridflow.algorithms.advantages.gae import GAE
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, token_clip, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    alg = cfg.algorithm
    return with_reward_side(cfg, GAE(gamma=alg.gamma, lam=alg.lam, whiten=alg.whiten_advantages), token_clip(cfg))


ALGORITHM = register_algorithm(AlgorithmRecord("ppo", build, critic=True, groups=False))
