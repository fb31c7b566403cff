"""Keep megatron-core's optimizer step free of per-parameter host reads when neither Transformer Engine nor Apex
is installed (our CPU default, and GPU hosts without them).

megatron-core 0.19 then falls back to torch pieces that read the device once per parameter:
  - the grad norm (`optimizer/clip_grads.py`, `l2_norm_impl = utils.local_multi_tensor_l2_norm`) builds
    `torch.tensor([norm_0, norm_1, ...])` from one 0-d device tensor per parameter: one device-to-host copy
    each (182 per step at SmolLM2-135M's 182 parameter tensors on the H200, 2026-12-04), then `float()` of the
    result;
  - Adam is `torch.optim.AdamW` built with `capturable=False` and no `fused`: its step counters live on the
    host and the foreach / single-tensor paths read each one (`_get_value(step)`) for the bias corrections,
    per parameter and step.
`sync_free_grad_norm` is a drop-in for amp_C's `multi_tensor_l2norm` that stays on the device (one norm per
tensor with `torch._foreach_norm`, then their norm), and `fuse_torch_adam` switches megatron's torch Adam to
torch's fused kernel (step counters on the parameters' device; CPU and CUDA). What is left per optimizer step
is megatron's one read of the total grad norm (it clips with a Python float).
"""

from __future__ import annotations

import torch
from megatron.core.optimizer import MegatronOptimizer, clip_grads
from megatron.core.utils import local_multi_tensor_l2_norm


def sync_free_grad_norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                        per_tensor: bool, *args) -> tuple[torch.Tensor, None]:
    """The 2-norm over every tensor of `tensor_lists` as a 1-element tensor on their device, no host read
    (amp_C.multi_tensor_l2norm's signature; `per_tensor` norms are not supported, as megatron's fallback)."""
    tensors = [t for group in tensor_lists for t in group]
    if not tensors:
        return noop_flag.new_zeros(1, dtype=torch.float), None
    norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms])).reshape(1), None


def install_sync_free_grad_norm() -> None:
    """Replace megatron's per-parameter-sync fallback grad norm with `sync_free_grad_norm`; a fused kernel
    (TE's or Apex's) is left alone."""
    if clip_grads.l2_norm_impl is local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = sync_free_grad_norm


def torch_adams(optimizer: MegatronOptimizer) -> list[torch.optim.Optimizer]:
    """The torch Adam / AdamW instances inside a megatron optimizer (chained or not)."""
    chained = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    inner = [getattr(o, "optimizer", None) for o in chained]
    return [o for o in inner if isinstance(o, torch.optim.Adam | torch.optim.AdamW)]


def fuse_torch_adam(optimizer: MegatronOptimizer) -> None:
    """Run megatron's torch Adam (its fallback without TE/Apex) with torch's fused kernel, before its first
    step: the step counters are then made on the parameters' device. No-op for TE's / Apex's FusedAdam."""
    for adam in torch_adams(optimizer):
        if any(adam.state.values()):
            raise ValueError("fuse_torch_adam: call it before the first step (the step counters exist)")
        for group in adam.param_groups:
            if group.get("differentiable"):
                continue
            group["fused"], group["foreach"] = True, False
