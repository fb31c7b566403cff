import math

import pytest
import torch

from hybridflow.algorithms import GroupNormalized, group_normalized_scores
from hybridflow.errors import UserError


def test_group_normalisation_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 1.0, 2.0, 2.0])
    adv = group_normalized_scores(scores, group_size=4, eps=0.0)
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3); group 2: all equal -> 0; group 3: mean 2.
    s1, s3 = math.sqrt(1 / 3), math.sqrt(2 / 3)
    expected = [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0, 0, 0, 0, 1 / s3, -1 / s3, 0, 0]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_without_std_scaling_only_centres():
    adv = group_normalized_scores(torch.tensor([1.0, 3.0, 10.0, 20.0]), 2, scale_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -5.0, 5.0]))


def test_group_size_must_divide_batch():
    with pytest.raises(UserError, match="rollout.n_samples_per_prompt"):
        group_normalized_scores(torch.zeros(6), 4)


def test_estimator_uses_sequence_score_and_broadcasts_over_mask():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    token_rewards = torch.zeros(4, 3)
    token_rewards[0, 1], token_rewards[1, 0], token_rewards[2, 2], token_rewards[3, 2] = 1.0, 0.0, 4.0, 2.0
    token_rewards[1, 2] = 100.0  # masked out: must not count
    out = GroupNormalized(group_size=2, eps=0.0)(token_rewards, mask)
    assert out.returns is None
    a = math.sqrt(0.5)  # a differing pair: deviations +-d, unbiased std d * sqrt(2)
    expected = torch.tensor([[a, a, 0], [-a, 0, 0], [a, a, a], [0, -a, -a]])
    torch.testing.assert_close(out.advantages, expected)
