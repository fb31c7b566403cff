import pytest
import torch

from hybridflow.algorithms import (
    ActorLossConfig,
    CriticLossConfig,
    actor_loss,
    critic_loss,
    entropy_from_logits,
    kl_k3,
    sft_loss,
    token_means,
)
from hybridflow.algorithms.losses.ppo_clip import TokenClip


def _batch(seed=0, b=3, t=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    new = (old + torch.randn(b, t, generator=g) * 0.3).requires_grad_()
    adv = torch.randn(b, t, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float32)[:b, :t]
    return new, old, adv, mask


def test_actor_loss_is_token_mean_of_clipped_surrogate():
    new, old, adv, mask = _batch()
    out = actor_loss(new, old, adv, mask, ActorLossConfig(TokenClip(0.2)))
    assert out[:3] == (out.loss_sum, out.num_tokens, out.metrics)  # megatron's (loss, num_tokens, reduced)
    torch.testing.assert_close(out.token_loss.sum(), out.loss_sum)  # loss_agg's input: masked per-token loss
    ratio = torch.exp(new - old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    m = mask.bool()
    assert int(out.num_tokens) == 10
    torch.testing.assert_close(out.loss_sum, per_token[m].sum())
    clipfrac = ((-adv * ratio.clamp(0.8, 1.2)) > (-adv * ratio))[m].float().mean()
    means = token_means([out])
    assert means["clipfrac"] == pytest.approx(clipfrac.item())
    assert means["approx_kl"] == pytest.approx(kl_k3(old, new.detach())[m].mean().item(), rel=1e-5)


def test_masked_tokens_get_no_gradient_even_with_junk():
    new, old, adv, mask = _batch()
    with torch.no_grad():
        new[~mask.bool()] = 40.0  # huge ratio in padding
    out = actor_loss(new, old, adv, mask, ActorLossConfig())
    out.loss_sum.backward()
    assert torch.isfinite(out.loss_sum)
    assert (new.grad[~mask.bool()] == 0).all() and (new.grad[mask.bool()] != 0).any()


def test_entropy_bonus_and_kl_loss_terms():
    new, old, adv, mask = _batch(1)
    entropy = torch.rand_like(old)
    ref = old - 0.1
    base = actor_loss(new, old, adv, mask, ActorLossConfig())
    full = actor_loss(
        new,
        old,
        adv,
        mask,
        ActorLossConfig(entropy_coef=0.01, kl_loss_coef=0.5),
        entropy=entropy,
        ref_logprobs=ref,
    )
    m = mask.bool()
    expected = base.loss_sum - 0.01 * entropy[m].sum() + 0.5 * kl_k3(new, ref)[m].sum()
    torch.testing.assert_close(full.loss_sum, expected)
    assert token_means([full])["entropy"] == pytest.approx(entropy[m].mean().item())
    with pytest.raises(ValueError, match="entropy"):
        actor_loss(new, old, adv, mask, ActorLossConfig(entropy_coef=0.01))
    with pytest.raises(ValueError, match="reference"):
        actor_loss(new, old, adv, mask, ActorLossConfig(kl_loss_coef=0.1))


def test_token_means_over_micro_batches_equal_whole_batch():
    new, old, adv, mask = _batch(2)
    whole = token_means([actor_loss(new, old, adv, mask, ActorLossConfig())])
    parts = token_means(
        [
            actor_loss(new[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], ActorLossConfig())
            for i in range(3)
        ]
    )
    assert parts == pytest.approx(whole)


def test_critic_loss():
    g = torch.Generator().manual_seed(3)
    values, old, returns = (torch.randn(2, 4, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    out = critic_loss(values, old, returns, mask, CriticLossConfig(cliprange_value=0.1))
    vclip = old + (values - old).clamp(-0.1, 0.1)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (vclip - returns) ** 2)
    torch.testing.assert_close(out.loss_sum, per_token[mask.bool()].sum())
    assert int(out.num_tokens) == 6
    assert set(token_means([out])) == {"vf_loss", "vf_clipfrac", "values"}


def test_entropy_reference_matches_torch_distributions():
    logits = torch.randn(2, 3, 11) * 4
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)


def test_sft_loss_is_masked_nll():
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    out = sft_loss(logprobs, mask)
    expected = -(torch.log(torch.tensor(0.25)) + torch.log(torch.tensor(0.9)) + torch.log(torch.tensor(0.1)))
    torch.testing.assert_close(out.loss_sum, expected)
    assert int(out.num_tokens) == 3


def _poisoned(t: torch.Tensor, mask: torch.Tensor, values=(float("inf"), float("nan"), -float("inf"))):
    """`t` with its padding positions overwritten by inf/NaN/-inf in turn."""
    pad = (~mask.bool()).nonzero()
    out = t.detach().clone()
    for i, (r, c) in enumerate(pad.tolist()):
        out[r, c] = values[i % len(values)]
    return out


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_inf_nan_in_padding_reach_neither_value_nor_gradient(mode):
    from hybridflow.algorithms import loss_agg

    new, old, adv, mask = _batch()
    ent, ref = torch.rand(3, 5), -torch.rand(3, 5)
    cfg = ActorLossConfig(TokenClip(0.2), entropy_coef=0.01, kl_loss_coef=0.1)

    def run(lp, old, adv, ent, ref):
        lp = lp.detach().clone().requires_grad_()
        out = actor_loss(lp, old, adv, mask, cfg, entropy=ent, ref_logprobs=ref, is_weights=torch.ones(3, 5))
        value = loss_agg.numerator(out.token_loss, out.mask, mode)
        value.backward()
        return value, lp.grad, out

    clean_value, clean_grad, _ = run(new, old, adv, ent, ref)
    value, grad, out = run(*(_poisoned(t, mask) for t in (new, old, adv, ent, ref)))
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    torch.testing.assert_close(value, clean_value)
    torch.testing.assert_close(grad, clean_grad)
    assert (grad[~mask.bool()] == 0).all()
    assert torch.isfinite(out.token_loss).all() and (out.token_loss[~mask.bool()] == 0).all()
    assert all(torch.isfinite(m) for m in out.metrics.values())


def test_numerator_ignores_inf_nan_token_loss_in_padding():
    from hybridflow.algorithms import loss_agg

    _, _, _, mask = _batch()
    token_loss = _poisoned(torch.rand(3, 5), mask).requires_grad_()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        value = loss_agg.numerator(token_loss, mask, mode)
        (grad,) = torch.autograd.grad(value, token_loss)
        assert torch.isfinite(value) and torch.isfinite(grad).all() and (grad[~mask.bool()] == 0).all()


def test_critic_loss_ignores_inf_nan_in_padding():
    g = torch.Generator().manual_seed(3)
    _, _, _, mask = _batch()
    v, old_v, ret = (torch.randn(3, 5, generator=g) for _ in range(3))
    cfg = CriticLossConfig()

    def run(v, old_v, ret):
        v = v.detach().clone().requires_grad_()
        out = critic_loss(v, old_v, ret, mask, cfg)
        out.token_loss.sum().backward()
        return out.loss_sum, v.grad

    clean = run(v, old_v, ret)
    poisoned = run(*(_poisoned(t, mask) for t in (v, old_v, ret)))
    torch.testing.assert_close(poisoned, clean)
