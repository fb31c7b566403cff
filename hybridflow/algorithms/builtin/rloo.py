"""RLOO (Ahmadian et al., 2024): each sample's baseline is the mean score of the other samples of its prompt."""

from hybridflow.algorithms.advantages.rloo import LeaveOneOut
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, group_size, token_clip, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    return with_reward_side(cfg, LeaveOneOut(group_size(cfg)), token_clip(cfg))


ALGORITHM = register_algorithm(AlgorithmRecord("rloo", build, critic=False, groups=True))
