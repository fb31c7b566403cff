import torch

from hybridflow.algorithms import OverlongPenalty, overlong_penalty


def test_penalty_ramps_over_the_buffer_by_hand():
    lengths = torch.tensor([3, 4, 5, 6, 8])
    # limit 8, buffer 4: free up to 4 tokens, then -0.5 * (len - 4) / 4
    expected = torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5])
    torch.testing.assert_close(overlong_penalty(lengths, max_length=8, buffer=4, penalty=0.5), expected)


def test_shaping_adds_the_penalty_of_each_response_length():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    shaped = OverlongPenalty(max_length=4, buffer=2, penalty=1.0)(torch.tensor([1.0, 1.0, 0.0]), mask)
    torch.testing.assert_close(shaped, torch.tensor([1.0, 0.0, -0.5]))
