"""Masked reductions over token tensors: only positions where `mask` is 1 count."""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over positions where `mask` is set (over `dim`, or everything).

    `where`, not `x * mask`, so an inf/NaN in a padding position cannot turn the sum into NaN.
    """
    masked = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return masked.sum() if dim is None else masked.sum(dim)


def last_masked_index(mask: torch.Tensor) -> torch.Tensor:
    """Column of each row's last masked-in position of a [B, T] mask, as [B]; -1 where a row has none."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over masked-in positions; 0 where nothing is masked in (no NaN from empty rows)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked-in entries of `x` (Bessel-corrected unless `unbiased=False`)."""
    count = mask.sum()
    mean = masked_mean(x, mask)
    sq_dev = masked_sum((x - mean) ** 2, mask)
    if unbiased:
        return sq_dev / (count - 1).clamp(min=1)
    return sq_dev / count.clamp(min=1)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Scale `x` to unit variance over masked-in entries (and zero mean unless `shift_mean=False`).

    Masked-out positions come back as 0 so they cannot leak into a later unmasked sum.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=x.dtype, device=x.device))
