"""Logits only where a loss reads them: a megatron-core `output_processor` that runs the LM head on the hidden
states before chosen tokens.

An RL micro-batch of right-padded rows reads log-probs and entropies at its response tokens only. On SmolLM2-135M
and gsm8k_easy that is ~35 of each row's ~270 columns: the rest are prompt and padding, yet the head's matmul and
every vocabulary-wide pass of the log-softmax and entropy (fp32, [tokens, 49152]) ran over all of them, about
half of a forward pass's device time (benchmarks/results/smollm2_race_h100_20261206/profile_c9eafa2_*). TRL's
`logits_to_keep` keeps the completion window for the same reason.

`logit_positions(loss_mask)` lists the tokens; `GPTModel.forward(..., output_processor=logits_at,
output_processor_context=positions)` then returns `[1, n, vocab / tp]` logits, one per listed token, predicted
from the hidden state before it; `scatter_positions` puts per-token results back on the `[b, T]` grid (zero
elsewhere). The gradient is the full-grid one: a masked-out position contributes nothing to the loss either way.
"""

from __future__ import annotations

import torch


def logit_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """[2, n] (row, column) of every token of `loss_mask` [b, T] that is set, row-major; column 0 (which nothing
    predicts) is never listed."""
    rows, cols = loss_mask[:, 1:].nonzero(as_tuple=True)
    return torch.stack([rows, cols + 1])


def logits_at(*, hidden_states: torch.Tensor, output_layer: torch.nn.Module, output_weight: torch.Tensor | None,
              runtime_gather_output: bool | None, context: torch.Tensor, scale_logits, **_) -> torch.Tensor:
    """megatron-core's `output_processor` signature: the logits `[1, n, vocab / tp]` of the tokens at `context`
    (`logit_positions`), from `hidden_states` `[s, b, h]` at the column before each."""
    if getattr(output_layer, "sequence_parallel", False):
        # each TP rank holds a slice of the sequence here; the role keeps every position instead
        raise ValueError("logits_at: the output layer is sequence-parallel; run it on every position")
    rows, cols = context
    picked = hidden_states[cols - 1, rows].unsqueeze(1)  # [n, 1, h]
    logits, _ = output_layer(picked, weight=output_weight, runtime_gather_output=runtime_gather_output)
    return scale_logits(logits).transpose(0, 1).contiguous()  # [1, n, vocab / tp], as GPTModel's [b, s, v]


def scatter_positions(values: torch.Tensor, positions: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`values` [1, n] (one per `positions` column) on a zero grid of `shape` [b, T]; differentiable."""
    return values.new_zeros(shape).index_put(tuple(positions), values[0])
