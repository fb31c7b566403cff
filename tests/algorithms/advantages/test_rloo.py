import torch

from hybridflow.algorithms import LeaveOneOut, leave_one_out_scores


def test_leave_one_out_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0])
    # group 1: 1 - (0+0+1)/3 = 2/3, 0 - (1+0+1)/3 = -2/3; group 2: 2 - (2+2+5)/3 = -1, 5 - (2+2+2)/3 = 3.
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -1.0, -1.0, -1.0, 3.0])
    torch.testing.assert_close(leave_one_out_scores(scores, 4), expected)


def test_pairs_get_plus_minus_the_difference():
    torch.testing.assert_close(leave_one_out_scores(torch.tensor([3.0, 1.0]), 2), torch.tensor([2.0, -2.0]))


def test_estimator_sums_token_rewards_and_fills_the_response():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    token_rewards = torch.tensor([[0.0, 1.0, 9.0], [0.5, 9.0, 9.0]])  # 9s are masked out
    est = LeaveOneOut(group_size=2)
    adv = est(token_rewards, mask)
    assert adv.returns is None
    torch.testing.assert_close(adv.advantages, torch.tensor([[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]]))
