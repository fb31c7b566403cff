"""DAPO (Yu et al., 2025): GRPO's advantages with clip-higher (algorithm.clip_high), the token-level loss
(every token of the mini-batch weighs the same: token-mean), over-long reward shaping and dynamic sampling
(groups whose samples all scored the same are replaced by newly drawn ones)."""

from hybridflow.algorithms.advantages.group_norm import GroupNormalized
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord, group_size, token_clip, with_reward_side
from hybridflow.algorithms.registry import register_algorithm
from hybridflow.algorithms.scores.group_filter import DropUniformGroups
from hybridflow.algorithms.scores.overlong import OverlongPenalty
from hybridflow.config import ExperimentConfig


def build(cfg: ExperimentConfig) -> Algorithm:
    alg = cfg.algorithm
    shaping = OverlongPenalty(cfg.rollout.max_new_tokens, alg.overlong_buffer, alg.overlong_penalty) \
        if alg.overlong_buffer else None
    return with_reward_side(cfg, GroupNormalized(group_size(cfg)), token_clip(cfg), shaping,
                            DropUniformGroups(group_size(cfg), alg.max_extra_draws))


ALGORITHM = register_algorithm(AlgorithmRecord("dapo", build, critic=False, groups=True,
                                               loss_agg_modes=("token-mean",), shapes_overlong=True))
