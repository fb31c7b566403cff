"""Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-like training"): centred within the group but not
divided by its std, and without the per-response length normalisation (so not seq-mean-token-mean)."""

from hybridflow.algorithms.advantages.group_norm import GroupNormalized
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, group_size, token_clip, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    return with_reward_side(cfg, GroupNormalized(group_size(cfg), scale_by_std=False), token_clip(cfg))


ALGORITHM = register_algorithm(AlgorithmRecord("dr_grpo", build, critic=False, groups=True,
                                               loss_agg_modes=("seq-mean-token-sum", "token-mean")))
