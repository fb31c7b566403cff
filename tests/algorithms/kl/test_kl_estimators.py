import math

import pytest
import torch

from hybridflow.algorithms import kl_estimator, kl_k1, kl_k2, kl_k3, kl_penalized_rewards, last_token_scores
from hybridflow.errors import UserError


def test_estimators_by_hand():
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # log_ratio = log(ref/pi) = log 0.5
    assert kl_k1(lp, ref).item() == pytest.approx(math.log(2))
    assert kl_k2(lp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_k3(lp, ref).item() == pytest.approx(0.5 - 1 - math.log(0.5))


def test_estimators_match_exact_kl_in_expectation():
    # Sample from pi; k1 and k3 are unbiased for KL(pi || ref), k2 close for nearby distributions.
    gen = torch.Generator().manual_seed(0)
    pi_logits, ref_logits = torch.randn(6, generator=gen), torch.randn(6, generator=gen) * 0.3
    pi, ref = (
        torch.distributions.Categorical(logits=pi_logits),
        torch.distributions.Categorical(logits=ref_logits),
    )
    exact = torch.distributions.kl_divergence(pi, ref).item()
    x = torch.multinomial(pi.probs, 400_000, replacement=True, generator=gen)
    lp, lref = pi.log_prob(x), ref.log_prob(x)
    assert kl_k1(lp, lref).mean().item() == pytest.approx(exact, rel=0.03)
    assert kl_k3(lp, lref).mean().item() == pytest.approx(exact, rel=0.03)
    assert kl_k3(lp, lref).var() < kl_k1(lp, lref).var()  # the point of k3
    assert (kl_k3(lp, lref) >= 0).all() and (kl_k2(lp, lref) >= 0).all()


def test_estimator_lookup():
    assert kl_estimator("k3") is kl_k3
    with pytest.raises(UserError, match="algorithm.kl_estimator"):
        kl_estimator("k9")


def test_last_token_scores():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 0]])
    out = last_token_scores(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    expected = torch.zeros(4, 4)
    expected[0, 1], expected[1, 3], expected[3, 2] = 1.0, 2.0, 4.0  # the empty row gets nothing
    torch.testing.assert_close(out, expected)


def test_kl_penalized_rewards_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    rewards, kl = kl_penalized_rewards(torch.tensor([5.0]), lp, ref, mask, kl_coef=0.1)
    # k1 per token: 0.5, -1.0, (masked); score 5 on the last valid token (index 1).
    torch.testing.assert_close(kl, torch.tensor([[0.5, -1.0, 0.0]]))
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 5.0 + 0.1, 0.0]]))


def test_k3_is_clamped_where_the_reference_is_far_more_likely():
    from hybridflow.algorithms.kl.estimators import K3_MAX

    lp, ref = torch.tensor([-30.0, math.log(0.5)]), torch.tensor([0.0, math.log(0.25)])
    got = kl_k3(lp, ref)
    assert got[0].item() == K3_MAX and torch.isfinite(got).all()
    assert got[1].item() == pytest.approx(0.5 - 1 - math.log(0.5))  # unclamped where small


def test_config_choices_are_the_estimators():
    from hybridflow.algorithms.kl.estimators import KL_ESTIMATORS
    from hybridflow.config.algorithm import KL_ESTIMATOR_NAMES

    assert tuple(sorted(KL_ESTIMATORS)) == KL_ESTIMATOR_NAMES


def test_unknown_estimator_names_the_field_it_came_from():
    with pytest.raises(UserError, match=r"^algorithm\.kl_loss_estimator: unknown 'k9'"):
        kl_estimator("k9", "algorithm.kl_loss_estimator")


def test_k2_gradient_is_trls_bias_corrected_k3_gradient_on_policy():
    """TRL 1.16 (use_bias_correction_kl, its default) multiplies k3 by the ratio pi / pi_old, differentiable: its
    gradient per token is ratio * (log pi - log ref), which at ratio 1 is k2's; plain k3's, 1 - ref / pi, is not."""
    ref = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    logp = torch.tensor([-0.2, -1.5, -1.0, -1.0], requires_grad=True)
    old = logp.detach()  # on-policy: pi_old = pi, ratio 1
    (kl_k3(logp, ref) * torch.exp(logp - old)).sum().backward()
    trl = logp.grad.clone()
    logp.grad = None
    kl_k2(logp, ref).sum().backward()
    torch.testing.assert_close(logp.grad, trl)
    torch.testing.assert_close(trl, (logp - ref).detach())  # the hand formula
    logp.grad = None
    kl_k3(logp, ref).sum().backward()
    assert not torch.allclose(logp.grad, trl, atol=1e-2)  # 0.55, 0.39, -0.65, 0.86 against 0.8, 0.5, -0.5, 2
