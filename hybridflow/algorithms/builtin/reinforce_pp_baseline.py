"""REINFORCE++ with the group mean as baseline, then whitened over the batch."""

from hybridflow.algorithms.advantages.reinforce_pp import ReinforcePPBaseline
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, group_size, token_clip, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    return with_reward_side(cfg, ReinforcePPBaseline(group_size(cfg)), token_clip(cfg))


ALGORITHM = register_algorithm(AlgorithmRecord("reinforce_pp_baseline", build, critic=False, groups=True))
