import torch

from hybridflow.algorithms import masked_mean, masked_sum, masked_var, masked_whiten


def test_masked_stats_equal_stats_of_selected_entries():
    torch.manual_seed(0)
    x = torch.randn(5, 8)
    mask = torch.rand(5, 8) > 0.4
    picked = x[mask]
    torch.testing.assert_close(masked_sum(x, mask), picked.sum())
    torch.testing.assert_close(masked_mean(x, mask), picked.mean())
    torch.testing.assert_close(masked_var(x, mask), picked.var())
    torch.testing.assert_close(masked_var(x, mask, unbiased=False), picked.var(unbiased=False))
    torch.testing.assert_close(
        masked_mean(x, mask.float(), dim=1), torch.stack([r[m].mean() for r, m in zip(x, mask, strict=True)])
    )


def test_empty_rows_and_padding_values():
    x = torch.tensor([[1.0, float("inf")], [float("nan"), 2.0]])
    mask = torch.tensor([[1, 0], [0, 0]])
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.0, 0.0]))


def test_whiten():
    torch.manual_seed(0)
    x = torch.randn(4, 6) * 3 + 7
    mask = torch.ones(4, 6)
    mask[0, 3:] = 0
    w = masked_whiten(x, mask)
    picked = w[mask.bool()]
    assert abs(picked.mean().item()) < 1e-5 and abs(picked.var().item() - 1) < 1e-4
    assert (w[~mask.bool()] == 0).all()
    keep_mean = masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(keep_mean[mask.bool()].mean(), x[mask.bool()].mean())
