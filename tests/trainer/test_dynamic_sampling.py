"""fill_batch: groups of equal scores are replaced by newly drawn ones until the batch is full."""

import torch

from hybridflow.algorithms import DropUniformGroups
from hybridflow.data.step_batch import StepBatch, concat_batches
from hybridflow.trainer.dynamic_sampling import fill_batch
from tests.single_turn import single_turn_kinds


def _scored(tag: str, scores: list[float], width: int = 4) -> StepBatch:
    """A generated, scored batch; each row's dataset row names its batch and position."""
    n = len(scores)
    return StepBatch(rows=[{"id": f"{tag}{i}"} for i in range(n)], tokens=torch.ones(n, width, dtype=torch.long),
                     prompt_lens=torch.zeros(n, dtype=torch.long),
                     token_kinds=single_turn_kinds(torch.zeros(n, dtype=torch.long), torch.ones(n, width)),
                     rollout_logprobs=torch.zeros(n, width), scores=torch.tensor(scores))


def _ids(batch: StepBatch) -> list[str]:
    return [row["id"] for row in batch.rows]


def test_dropped_groups_are_replaced_by_drawn_ones_in_order():
    first = _scored("a", [1, 1, 0, 1, 0, 0])  # groups of 2: (1,1) dropped, (0,1) kept, (0,0) dropped
    more = iter([_scored("b", [0, 0, 1, 0, 1, 1], width=6), _scored("c", [0, 1, 1, 0, 0, 0])])
    full, metrics = fill_batch(first, lambda: next(more), DropUniformGroups(group_size=2, max_extra_draws=4))
    # kept: a2 a3, then b2 b3, then c0 c1 (c2 c3 also varied, beyond the target of 6 rows)
    assert _ids(full) == ["a2", "a3", "b2", "b3", "c0", "c1"]
    assert full.scores.tolist() == [0, 1, 1, 0, 0, 1]
    assert full.tokens.shape == (6, 6)  # b's width; a's and c's rows padded with masked-out columns
    assert full.loss_mask[:, 4:].tolist() == [[0, 0], [0, 0], [1, 1], [1, 1], [0, 0], [0, 0]]
    assert metrics == {"dynamic_sampling/extra_draws": 2.0, "dynamic_sampling/dropped_groups": 5.0,
                       "dynamic_sampling/topped_up_groups": 0.0,
                       "dynamic_sampling/generated_reward_mean": 8 / 18}  # 3 + 3 + 2 ones


def test_a_full_first_batch_draws_nothing():
    first = _scored("a", [0, 1, 1, 0])

    def no_draw():
        raise AssertionError("drew although the batch was full")

    full, metrics = fill_batch(first, no_draw, DropUniformGroups(group_size=2, max_extra_draws=3))
    assert _ids(full) == ["a0", "a1", "a2", "a3"] and metrics["dynamic_sampling/extra_draws"] == 0


def test_when_draws_run_out_the_batch_is_topped_up_with_dropped_groups():
    first = _scored("a", [1, 1, 0, 1, 0, 0])
    more = iter([_scored("b", [1, 1, 1, 1, 0, 0])])
    full, metrics = fill_batch(first, lambda: next(more), DropUniformGroups(group_size=2, max_extra_draws=1))
    assert _ids(full) == ["a2", "a3", "a0", "a1", "a4", "a5"]  # kept, then the earliest dropped groups
    assert metrics["dynamic_sampling/topped_up_groups"] == 2.0
    assert metrics["dynamic_sampling/dropped_groups"] == 5.0


def test_concat_pads_narrower_batches_with_masked_columns():
    out = concat_batches([_scored("a", [0.0], width=2), _scored("b", [1.0], width=3)])
    assert out.tokens.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert out.loss_mask.tolist() == [[1, 1, 0], [1, 1, 1]] and out.scores.tolist() == [0.0, 1.0]
