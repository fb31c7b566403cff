import math

import torch

from hybridflow.algorithms import SequenceClip, loss_agg, sequence_clip_loss


def _batch():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    # row 0: token log-ratios 0.1, 0.3 (third masked): s = exp(0.2); row 1: one token, log-ratio -0.1
    new = (old + torch.tensor([[0.1, 0.3, 5.0], [-0.1, 5.0, 5.0]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]])
    return new, old, adv, mask


def test_sequence_ratio_is_the_geometric_mean_and_clips_per_sequence():
    new, old, adv, mask = _batch()
    loss, clipped = sequence_clip_loss(new, old, adv, mask, clip_low=0.1, clip_high=0.1)
    # row 0: s = e^0.2 = 1.2214 > 1.1, A = 1 -> -min(s, 1.1) = -1.1, clipped (no gradient)
    # row 1: s = e^-0.1 = 0.9048 inside [0.9, 1.1], A = -2 -> 2 * 0.9048
    torch.testing.assert_close(loss, torch.tensor([-1.1, 2 * math.exp(-0.1)]))
    assert clipped.tolist() == [True, False]
    loss.sum().backward()
    # d(-A s)/d logp_t = -A s / |y| for the unclipped row; 0 for the clipped one and for masked tokens
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 0.0, 0.0], [2 * math.exp(-0.1), 0.0, 0.0]]))


def test_token_copies_average_to_the_mean_sequence_loss():
    new, old, adv, mask = _batch()
    token_loss, clipped = SequenceClip(0.1, 0.1)(new, old, adv, mask)
    assert token_loss.shape == new.shape and clipped.shape == new.shape
    mean = loss_agg.numerator(token_loss, mask, "seq-mean-token-mean") / 2
    torch.testing.assert_close(mean, torch.tensor((-1.1 + 2 * math.exp(-0.1)) / 2))


def test_one_token_sequences_match_ppo():
    from hybridflow.algorithms import ppo_policy_loss

    old = torch.tensor([[-1.0], [-2.0], [-0.5]])
    new = old + torch.tensor([[0.5], [-0.05], [-0.5]])
    adv = torch.tensor([[1.0], [-1.0], [-3.0]])
    mask = torch.ones(3, 1)
    seq, _ = sequence_clip_loss(new, old, adv, mask, 0.2, 0.3)
    tok, _ = ppo_policy_loss(new, old, adv, 0.2, 0.3)
    torch.testing.assert_close(seq, tok[:, 0])


def test_far_off_sequence_ratio_is_clamped_and_finite():
    # float32: mean log-ratio 90 -> exp overflows -> NaN gradient without the clamp
    new = torch.full((1, 2), 90.0, requires_grad=True)
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    loss, _ = sequence_clip_loss(new, old, torch.ones(1, 2), mask, clip_low=0.1, clip_high=0.1)
    loss.sum().backward()
    assert abs(loss.item() + 1.1) < 1e-6 and torch.isfinite(new.grad).all()
    new64 = torch.full((1, 2), 25.0, dtype=torch.float64)
    loss64, _ = sequence_clip_loss(new64, old.double(), -torch.ones(1, 2, dtype=torch.float64), mask.double(),
                                   clip_low=0.1, clip_high=0.1)
    assert abs(loss64.item() / math.exp(20.0) - 1) < 1e-12  # -A * exp(clamp(25, +-20))
