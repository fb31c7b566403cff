"""GSPO (Zheng et al., 2025): group-normalised advantages and a per-sequence clipped ratio. The loss is per
sequence: its token copies are averaged within the sequence, then over sequences (seq-mean-token-mean)."""

from hybridflow.algorithms.advantages.group_norm import GroupNormalized
from hybridflow.algorithms.losses.gspo_clip import SequenceClip
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, group_size, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    alg = cfg.algorithm
    clip_high = alg.cliprange if alg.clip_high is None else alg.clip_high
    return with_reward_side(cfg, GroupNormalized(group_size(cfg)), SequenceClip(alg.cliprange, clip_high))


ALGORITHM = register_algorithm(AlgorithmRecord("gspo", build, critic=False, groups=True,
                                               loss_agg_modes=("seq-mean-token-mean",), dual_clip=False))
