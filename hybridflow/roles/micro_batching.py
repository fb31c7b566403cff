"""A role's rows cut into right-padded micro-batches on the compute device (ModelRole.micro_batches; the packed
layout is hybridflow.data.packing's).

Rows whose lengths (`seq_lens`) are known are sorted by length first, and each micro-batch is cut to its own
longest row (rounded up to `TRIM_MULTIPLE` columns): a batch is trimmed to its longest sample
(StepBatch.trim_columns), and without the sort every micro-batch keeps that width, mostly padding at SmolLM2's
~107-token prompts and 10-160-token responses. Losses
sum over the whole mini-batch (hybridflow.algorithms.loss_agg scales each micro-batch by the mini-batch's
count), so which rows share a micro-batch does not change the gradient. Such a micro-batch carries `row_index`,
its rows' places in `tensors`, so forward results go back in order (ModelRole.forward).
"""

from __future__ import annotations

import torch

from hybridflow.config.data import TRIM_MULTIPLE
from hybridflow.data.step_batch import trimmed_width
from megatron_adapters.output_positions import logit_positions


def padded_micro_batches(tensors: dict[str, torch.Tensor], size: int, device: torch.device,
                         logits_at_loss_tokens: bool) -> list[dict[str, torch.Tensor]]:
    """`tensors` ([B, T] per token, [B] per sample, on the host) in micro-batches of `size` rows (the last may be
    smaller), by length when `seq_lens` is there, else in order at the full width; with `logit_positions` from
    the host's loss mask when `logits_at_loss_tokens`."""
    # One copy per tensor, then device-side slices: a copy per micro-batch and tensor is a host-to-device
    # transfer (from pageable memory, synchronous with the host) each, hundreds per pass for a small model.
    on_device = {k: v.to(device, non_blocking=True) for k, v in tensors.items()}
    rows = next(iter(tensors.values())).shape[0]
    mask = tensors.get("loss_mask") if logits_at_loss_tokens else None
    if "seq_lens" not in tensors:
        return [_positioned({k: v[i : i + size] for k, v in on_device.items()},
                            None if mask is None else mask[i : i + size]) for i in range(0, rows, size)]
    order = torch.argsort(tensors["seq_lens"], stable=True)
    order_on_device = order.to(device, non_blocking=True)
    lengths = tensors["seq_lens"][order].tolist()  # one read of the host tensor, not one per micro-batch
    micro = []
    for i in range(0, rows, size):
        picked, index = order[i : i + size], order_on_device[i : i + size]
        width = trimmed_width(max(lengths[i : i + size]), TRIM_MULTIPLE, tensors["input_ids"].shape[1])
        mb = {k: v.index_select(0, index)[:, :width] if v.dim() > 1 else v.index_select(0, index)
              for k, v in on_device.items()}
        micro.append(_positioned({**mb, "row_index": index}, None if mask is None else mask[picked, :width]))
    return micro


def with_logit_positions(mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host-side micro-batch with its `logit_positions` (megatron_adapters.output_positions), if it has a loss
    mask."""
    return _positioned(mb, mb.get("loss_mask"))


def _positioned(mb: dict[str, torch.Tensor], host_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """`mb` with the `logit_positions` of `host_mask` (its loss mask on the host: nonzero() on the device would
    wait for it), or as it is without one."""
    if host_mask is None:
        return mb
    return {**mb, "logit_positions": logit_positions(host_mask).to(mb["loss_mask"].device, non_blocking=True)}
