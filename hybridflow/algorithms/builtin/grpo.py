"""GRPO (Shao et al., 2024): advantages normalised within each prompt's group of samples, no critic."""

from hybridflow.algorithms.advantages.group_norm import GroupNormalized
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, group_size, token_clip, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    return with_reward_side(cfg, GroupNormalized(group_size(cfg)), token_clip(cfg))


ALGORITHM = register_algorithm(AlgorithmRecord("grpo", build, critic=False, groups=True))
