"""REINFORCE++ (Hu et al., 2025): discounted returns whitened over the batch; one sample per prompt is enough."""

from hybridflow.algorithms.advantages.reinforce_pp import ReinforcePP
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, token_clip, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    return with_reward_side(cfg, ReinforcePP(gamma=cfg.algorithm.gamma), token_clip(cfg))


ALGORITHM = register_algorithm(AlgorithmRecord("reinforce_pp", build, critic=False, groups=False))
