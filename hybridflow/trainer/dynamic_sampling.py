"""DAPO's dynamic sampling at the start of the step: keep the groups the filter keeps, generate and score
more prompts until the batch is full again (hybridflow/algorithms/scores/group_filter.py says which groups go).

Every rank runs this with the same shared scores and the same data loader state, so every rank takes the same
decisions and draws the same prompts: the collectives inside generation stay matched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridflow.algorithms import DropUniformGroups
from hybridflow.data.step_batch import StepBatch, concat_batches


def fill_batch(
    first: StepBatch, draw: Callable[[], StepBatch], group_filter: DropUniformGroups
) -> tuple[StepBatch, dict[str, float]]:
    """A batch of `first.size` samples (whole groups) from `first` and up to `group_filter.max_extra_draws`
    more generated, scored batches from `draw`; kept groups first, in draw order.

    If the draws run out first, the batch is topped up with dropped groups (earliest first): they train like
    any all-equal group in plain GRPO (zero advantage), and the metrics count them.
    """
    target, group = first.size, group_filter.group_size
    kept: list[StepBatch] = []
    dropped: list[StepBatch] = []
    generated: list[float] = []
    batch, draws = first, 0
    while True:
        keep = group_filter.keep(batch.scores)
        kept.append(batch.select(keep))
        dropped.append(batch.select(~keep))
        generated += batch.scores.tolist()
        n_kept = sum(b.size for b in kept)
        if n_kept >= target or draws == group_filter.max_extra_draws:
            break
        batch = draw()
        draws += 1
    full = concat_batches(kept + dropped).select(torch.arange(target))
    return full, {
        "dynamic_sampling/extra_draws": float(draws),
        "dynamic_sampling/dropped_groups": float(sum(b.size for b in dropped) // group),
        "dynamic_sampling/topped_up_groups": float(max(target - n_kept, 0) // group),
        # The policy's reward on everything it generated (the training batch's mean is biased by the filter).
        "dynamic_sampling/generated_reward_mean": sum(generated) / len(generated),
    }
