import math

import torch

from hybridflow.algorithms import ReinforcePP, ReinforcePPBaseline, discounted_returns


def test_discounted_returns_skip_masked_positions():
    rewards = torch.tensor([[0.0, 1.0, 7.0, 2.0]])
    mask = torch.tensor([[1, 1, 0, 1]])
    # t=3: 2; t=2 masked (0, passes 2 on); t=1: 1 + 0.5*2 = 2; t=0: 0 + 0.5*2 = 1
    torch.testing.assert_close(discounted_returns(rewards, mask, 0.5), torch.tensor([[1.0, 2.0, 0.0, 2.0]]))


def test_reinforce_pp_whitens_returns_over_the_batch():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 2.0]])
    mask = torch.tensor([[1, 1], [0, 1]])
    adv = ReinforcePP(gamma=1.0)(rewards, mask)
    # returns on masked-in tokens: 1, 1, 2 -> mean 4/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3
    sd = math.sqrt(1 / 3)
    expected = torch.tensor([[-1 / 3 / sd, -1 / 3 / sd], [0.0, 2 / 3 / sd]])
    torch.testing.assert_close(adv.advantages, expected, atol=1e-4, rtol=1e-4)
    assert adv.returns is None


def test_reinforce_pp_baseline_centres_in_groups_then_whitens_over_tokens():
    # groups of 2: scores (1, 0) and (3, 3); response lengths 1, 2, 1, 1
    mask = torch.tensor([[1, 0], [1, 1], [1, 0], [1, 0]], dtype=torch.float32)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [3.0, 0.0], [3.0, 0.0]])
    adv = ReinforcePPBaseline(group_size=2)(rewards, mask)
    # centred: 0.5, -0.5, 0, 0; tokens 0.5, -0.5, -0.5, 0, 0 -> mean -0.1, unbiased var 0.7 / 4
    sd = math.sqrt(0.7 / 4)
    expected = torch.tensor([[0.6 / sd, 0.0], [-0.4 / sd, -0.4 / sd], [0.1 / sd, 0.0], [0.1 / sd, 0.0]])
    torch.testing.assert_close(adv.advantages, expected, atol=1e-4, rtol=1e-4)
