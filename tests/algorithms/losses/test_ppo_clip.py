import math

import pytest
import torch

from hybridflow.algorithms import ppo_policy_loss


@pytest.mark.parametrize(
    ("advantage", "ratio", "expected_loss", "clipped", "has_grad"),
    [
        (2.0, 1.5, -2.0 * 1.2, True, False),  # A > 0, ratio above 1 + eps: clipped, no push further up
        (2.0, 0.5, -2.0 * 0.5, False, True),  # A > 0, ratio below 1 - eps: unclipped, still pushes up
        (-2.0, 0.5, 2.0 * 0.8, True, False),  # A < 0, ratio below 1 - eps: clipped, no push further down
        (-2.0, 1.5, 2.0 * 1.5, False, True),  # A < 0, ratio above 1 + eps: unclipped, still pushes down
        (2.0, 1.1, -2.0 * 1.1, False, True),  # inside the trust region
    ],
)
def test_clip_cases(advantage, ratio, expected_loss, clipped, has_grad):
    logprobs = torch.tensor([math.log(ratio)], requires_grad=True)
    loss, was_clipped = ppo_policy_loss(logprobs, torch.zeros(1), torch.tensor([advantage]), 0.2, 0.2)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    assert bool(was_clipped) is clipped
    loss.sum().backward()
    # d/dlogp of -A * exp(logp) is -A * ratio when unclipped, 0 when clipped.
    assert logprobs.grad.item() == pytest.approx(-advantage * ratio if has_grad else 0.0, rel=1e-6)


def test_asymmetric_clip():
    logprobs = torch.log(torch.tensor([1.25, 1.25, 0.75]))
    loss, clipped = ppo_policy_loss(logprobs, torch.zeros(3), torch.tensor([1.0, 1.0, -1.0]), 0.2, 0.28)
    # 1.25 < 1 + 0.28 stays unclipped for A > 0; 0.75 < 1 - 0.2 clips for A < 0.
    torch.testing.assert_close(loss, torch.tensor([-1.25, -1.25, 0.8]))
    assert clipped.tolist() == [False, False, True]


def test_on_policy_loss_is_minus_advantage():
    adv = torch.randn(2, 4)
    lp = torch.randn(2, 4)
    loss, clipped = ppo_policy_loss(lp, lp.clone(), adv, 0.2, 0.2)
    torch.testing.assert_close(loss, -adv)
    assert not clipped.any()


@pytest.mark.parametrize(
    ("advantage", "ratio", "expected_loss"),
    [
        (-1.0, 5.0, 3.0),  # A < 0, ratio 5: plain PPO pays -A * 5 = 5; the dual clip caps it at -A * c = 3
        (-1.0, 2.0, 2.0),  # below the cap: unchanged (-A * ratio = 2)
        (2.0, 5.0, -2.0 * 1.2),  # A > 0: the dual clip does not apply
    ],
)
def test_dual_clip_caps_negative_advantage_losses(advantage, ratio, expected_loss):
    logp, old = torch.tensor([math.log(ratio)]), torch.tensor([0.0])
    loss, _ = ppo_policy_loss(logp, old, torch.tensor([advantage]), 0.2, 0.2, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(expected_loss)


def test_asymmetric_clip_uses_clip_high_above_one():
    logp, old, adv = torch.tensor([math.log(1.5)]), torch.tensor([0.0]), torch.tensor([1.0])
    loss, clipped = ppo_policy_loss(logp, old, adv, 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28) and clipped.item()


def test_float32_log_ratio_90_gives_finite_loss_and_gradient():
    # exp(90) overflows float32: the unclipped branch is -inf and torch.maximum's backward multiplies 0 by inf
    logprobs = torch.tensor([90.0], requires_grad=True)
    loss, clipped = ppo_policy_loss(logprobs, torch.zeros(1), torch.tensor([1.0]), 0.2, 0.2)
    loss.sum().backward()
    assert loss.item() == pytest.approx(-1.2) and bool(clipped)
    assert torch.isfinite(logprobs.grad).all() and logprobs.grad.item() == 0.0


def test_float64_log_ratio_25_with_negative_advantage_is_the_clamped_formula():
    logprobs = torch.tensor([25.0], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([-0.5], dtype=torch.float64)
    loss, _ = ppo_policy_loss(logprobs, torch.zeros(1, dtype=torch.float64), adv, 0.2, 0.2)
    # unclamped: 0.5 * e^25 = 3.6e10; clamped at LOG_RATIO_MAX = 20: 0.5 * e^20
    assert loss.item() == pytest.approx(0.5 * math.exp(20.0), rel=1e-12)
    loss.sum().backward()
    assert logprobs.grad.item() == 0.0  # beyond the clamp: no gradient pushing it further


def test_clamp_leaves_ordinary_ratios_alone():
    lp = torch.tensor([19.0, -19.0, 0.3], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    loss, _ = ppo_policy_loss(lp, torch.zeros(3, dtype=torch.float64), adv, 0.2, 0.2)
    expected = torch.tensor([math.exp(19.0), -math.exp(-19.0), math.exp(0.3)], dtype=torch.float64)
    torch.testing.assert_close(loss, expected)
