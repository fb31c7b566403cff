"""One role's forward (and backward) over micro-batches, under megatron-core's pipeline schedules.

`run_forward_backward` wraps `megatron.core.pipeline_parallel.get_forward_backward_func` (no pipelining,
1F1B, or interleaved when several model chunks are given) with the role's own process groups. The caller
supplies the loss: the PPO/GRPO policy and value losses plug in as `loss_fn`, and forward-only inference
(reference log-probs, critic values) uses the same entry point with `forward_only=True` and a `loss_fn` that
returns the per-token outputs as metrics.

Loss scaling: megatron divides each micro-batch loss by the number of micro-batches, and DDP averages
gradients over the data-parallel group, so the gradient is that of the mean of the micro-batch losses over
the whole role batch. `loss_fn` should therefore return a per-micro-batch *mean* (e.g. the masked token mean).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.utils import get_model_config

from megatron_adapters.cpu_backend import compute_device
from megatron_adapters.output_positions import logits_at

MicroBatch = dict[str, torch.Tensor]
Metrics = dict[str, torch.Tensor]
# (model output on the last stage, the micro-batch) -> (scalar loss, detached metrics)
LossFn = Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor, Metrics]]


def default_model_inputs(batch: MicroBatch) -> dict[str, Any]:
    """GPTModel keyword arguments from a micro-batch with `input_ids` and optional positions / mask.

    A packed micro-batch (`input_ids` `[1, N]` with `cu_seqlens`, see hybridflow.data.packing) runs in
    megatron's "thd" layout: `PackedSeqParams` make attention causal inside each sequence and rotary
    positions restart per sequence; there is no attention mask. A micro-batch with `logit_positions`
    (megatron_adapters.output_positions) gets logits for those tokens only, `[1, n, vocab / tp]`.
    """
    input_ids = batch["input_ids"]
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    inputs = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": batch.get("attention_mask")}
    if "cu_seqlens" in batch:
        inputs["packed_seq_params"] = packed_seq_params(batch["cu_seqlens"])
    if "logit_positions" in batch:
        inputs |= {"output_processor": logits_at, "output_processor_context": batch["logit_positions"]}
    return inputs


def packed_seq_params(cu_seqlens: torch.Tensor) -> PackedSeqParams:
    """megatron's "thd" parameters for self-attention over sequences at int32 offsets `cu_seqlens`."""
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=longest, max_seqlen_kv=longest)


def run_forward_backward(
    model_chunks: Sequence[torch.nn.Module],
    pg_collection: ProcessGroupCollection,
    micro_batches: Sequence[MicroBatch],
    loss_fn: LossFn,
    *,
    forward_only: bool = False,
    model_inputs: Callable[[MicroBatch], dict[str, Any]] = default_model_inputs,
    broadcast_metrics: bool = True,
) -> list[Metrics]:
    """Run forward (and backward unless `forward_only`) over `micro_batches`; return per-micro-batch metrics.

    Args:
        model_chunks: this rank's model chunks of the role (one, or several for interleaved PP; DDP-wrapped
            for training). Gradients accumulate into their grad buffers; the caller steps the optimizer.
        pg_collection: the role's groups from `process_groups.build_role_groups`.
        micro_batches: this data-parallel replica's micro-batches, the same on every TP/PP rank of it, in
            `input_ids` of one shape `[micro_batch_size, seq_length]`, or packed (`[1, N_i]`, N_i varying;
            pipeline stages then exchange each activation's shape, megatron's `variable_seq_lengths`).
        loss_fn: called on the last pipeline stage with the model output (`[b, s, vocab/tp]` logits for an
            LM head) and the micro-batch; returns the scalar loss and a dict of detached tensors.
        forward_only: no backward, run under `torch.no_grad()` in eval mode (inference for ref/critic/reward).
        model_inputs: maps a micro-batch to the model's keyword arguments.
        broadcast_metrics: send the last stage's metrics to every pipeline stage, so all ranks of the role
            return the same list; otherwise non-last stages return `[]`.

    Interleaved PP on gloo needs `overlap_p2p_comm=True, batch_p2p_comm=False` in the model config (else
    gradients were silently wrong in our measurements).
    """
    if not micro_batches:
        raise ValueError("micro_batches: empty; give at least one micro-batch")
    chunks = list(model_chunks)
    config = get_model_config(chunks[0])
    micro_batch_size, seq_length = micro_batches[0]["input_ids"].shape[:2]
    shapes = {tuple(mb["input_ids"].shape[:2]) for mb in micro_batches}

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        output = model(**model_inputs(batch))

        def loss_on_batch(output_tensor):
            loss, metrics = loss_fn(output_tensor, batch)
            # clone: megatron scales the returned loss in place (/= num_microbatches).
            return loss, {key: value.detach().clone() for key, value in metrics.items()}

        return output, loss_on_batch

    data_iterator = iter(micro_batches) if len(chunks) == 1 else [iter(micro_batches) for _ in chunks]
    schedule = get_forward_backward_func(
        pp_size=pg_collection.pp.size(), vp_size=len(chunks) if len(chunks) > 1 else None
    )
    with (torch.no_grad() if forward_only else torch.enable_grad(), _eval_mode(chunks, forward_only),
          _variable_seq_lengths(config, len(shapes) > 1)):
        metrics = schedule(
            forward_step_func=forward_step,
            data_iterator=data_iterator,
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=len(micro_batches),
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            forward_only=forward_only,
            pg_collection=pg_collection,
            p2p_communicator=P2PCommunicator(pg_collection.pp, config),
        )
    if broadcast_metrics and pg_collection.pp.size() > 1:
        metrics = broadcast_from_last_stage(metrics, pg_collection.pp)
    return list(metrics)


@contextmanager
def _eval_mode(chunks: list[torch.nn.Module], on: bool) -> Iterator[None]:
    """Forward-only passes (reference, old log-probs, values, rewards) run without dropout, as the rollout
    samples: with LoRA dropout on, the actor's log-probs of the rollout's tokens were the dropped-out model's
    (parity gate off by 0.16 on tiny_cpu). Each module's mode comes back after."""
    if not on:
        yield
        return
    modes = [(m, m.training) for chunk in chunks for m in chunk.modules()]
    for chunk in chunks:
        chunk.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@contextmanager
def _variable_seq_lengths(config, on: bool) -> Iterator[None]:
    """Turn on megatron's per-message shape exchange between pipeline stages while shapes vary (the
    schedule otherwise sizes every receive buffer from `seq_length` x `micro_batch_size`)."""
    saved = config.variable_seq_lengths
    config.variable_seq_lengths = saved or on
    try:
        yield
    finally:
        config.variable_seq_lengths = saved


def broadcast_from_last_stage(metrics: list[Metrics], pp_group: dist.ProcessGroup) -> list[Metrics]:
    """Copy the last pipeline stage's list of metric dicts to every stage of `pp_group`.

    Only the layout (keys, shapes, dtypes) travels as a Python object; the values are broadcast as tensors.
    """
    src = dist.get_global_rank(pp_group, pp_group.size() - 1)
    is_src = pp_group.rank() == pp_group.size() - 1
    layout = [[(k, tuple(v.shape), v.dtype) for k, v in m.items()] for m in metrics] if is_src else None
    holder = [layout]
    dist.broadcast_object_list(holder, src=src, group=pp_group)
    device = compute_device()
    result = []
    for index, entries in enumerate(holder[0]):
        received = {}
        for key, shape, dtype in entries:
            buffer = (
                metrics[index][key].to(device).contiguous()
                if is_src
                else torch.empty(shape, dtype=dtype, device=device)
            )
            dist.broadcast(buffer, src=src, group=pp_group)
            received[key] = buffer
        result.append(received)
    return result

