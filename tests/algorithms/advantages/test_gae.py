import pytest
import torch

from hybridflow.algorithms import GAE, gae_advantages, masked_mean, masked_var


def test_three_tokens_by_hand():
    # gamma 0.9, lam 0.8, rewards (0, 0, 1), values (0.5, 0.4, 0.3); episode ends after token 2.
    # A2 = 1 - 0.3 = 0.7
    # A1 = (0 + 0.9 * 0.3 - 0.4) + 0.72 * 0.7 = 0.374
    # A0 = (0 + 0.9 * 0.4 - 0.5) + 0.72 * 0.374 = 0.12928
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.4, 0.3]])
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.12928, 0.374, 0.7]]))
    torch.testing.assert_close(ret, torch.tensor([[0.62928, 0.774, 1.0]]))


def test_masked_positions_are_skipped_and_zero():
    # The same three tokens with padding before, between and after: valid positions keep their values.
    rewards = torch.tensor([[9.0, 0.0, 9.0, 0.0, 1.0, 9.0]])
    values = torch.tensor([[7.0, 0.5, 7.0, 0.4, 0.3, 7.0]])
    mask = torch.tensor([[0, 1, 0, 1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.12928, 0.0, 0.374, 0.7, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, 0.62928, 0.0, 0.774, 1.0, 0.0]]))


def test_lambda_one_gamma_one_is_monte_carlo():
    torch.manual_seed(0)
    rewards, values = torch.randn(4, 7), torch.randn(4, 7)
    mask = torch.ones(4, 7)
    mask[1, 5:] = 0  # a shorter response
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    masked_rewards = rewards * mask
    reward_to_go = masked_rewards.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(ret, reward_to_go * mask)
    torch.testing.assert_close(adv, (reward_to_go - values) * mask)


def test_lambda_zero_is_one_step_td():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.1, 0.2, 0.3]])
    adv, _ = gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.5 * 0.2 - 0.1, 2.0 + 0.5 * 0.3 - 0.2, 3.0 - 0.3]]))


def test_nan_in_padding_does_not_leak():
    values = torch.tensor([[0.5, float("nan")]])
    adv, ret = gae_advantages(torch.tensor([[1.0, float("nan")]]), values, torch.tensor([[1, 0]]), 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0]]))
    assert torch.isfinite(ret).all()


@pytest.mark.parametrize("whiten", [True, False])
def test_estimator_whitens_over_mask(whiten):
    torch.manual_seed(1)
    rewards, values = torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    out = GAE(gamma=1.0, lam=0.95, whiten=whiten)(rewards, mask, values)
    raw, ret = gae_advantages(rewards, values, mask, 1.0, 0.95)
    torch.testing.assert_close(out.returns, ret)  # returns are never whitened: they are the critic target
    if whiten:
        assert abs(float(masked_mean(out.advantages, mask))) < 1e-6
        assert abs(float(masked_var(out.advantages, mask)) - 1.0) < 1e-4
        assert (out.advantages[mask == 0] == 0).all()
    else:
        torch.testing.assert_close(out.advantages, raw)
