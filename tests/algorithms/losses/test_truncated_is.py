"""Truncated importance sampling: weights by hand, and what they do to the actor loss and its gradient."""

import math

import pytest
import torch

from hybridflow.algorithms import ActorLossConfig, actor_loss, token_means
from hybridflow.algorithms.losses.truncated_is import truncated_is_weights


def test_weights_are_the_probability_ratio_capped():
    # pi_old / pi_rollout = 0.5 / 0.25 = 2 (capped to 1.5), 0.2 / 0.4 = 0.5, 0.3 / 0.3 = 1.
    old = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.3]]))
    w = truncated_is_weights(old, rollout, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 1.0]]))


def test_weights_carry_no_gradient():
    old = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    w = truncated_is_weights(old, torch.tensor([[-1.5, -1.0]]), cap=2.0)
    assert not w.requires_grad


def test_actor_loss_weights_each_tokens_policy_loss():
    # Two tokens, ratio pi/pi_old = 1 (new == old), so the clipped surrogate is -A per token; weights 1.5 and 0.5.
    new = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = new.detach().clone()
    adv = torch.tensor([[2.0, -4.0]])
    mask = torch.ones(1, 2)
    w = torch.tensor([[1.5, 0.5]])
    out = actor_loss(new, old, adv, mask, ActorLossConfig(), is_weights=w)
    # loss = 1.5 * -2 + 0.5 * 4 = -1
    assert float(out.loss_sum) == pytest.approx(-1.0)
    assert token_means([out])["is_weight"] == pytest.approx(1.0)
    # d/d logp of -A * w * exp(logp - old) at logp == old is -A * w: -3 and 2.
    out.loss_sum.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[-3.0, 2.0]]))


def test_no_weights_is_plain_ppo():
    new = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = actor_loss(new, new.detach() - 0.1, torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), ActorLossConfig())
    # ratio e^0.1 = 1.105 is inside the clip (1.2): loss = -2 * e^0.1
    assert float(out.loss_sum) == pytest.approx(-2 * math.exp(0.1))
    assert "is_weight" not in out.metrics
