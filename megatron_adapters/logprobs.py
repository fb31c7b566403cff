"""Log-probabilities of given tokens and entropy from vocab-parallel logits, without a full-vocab gather.

A tensor-parallel LM head leaves each TP rank with logits for its slice of the (padded) vocabulary,
`[..., vocab_padded / tp]`. Token log-probabilities come from megatron-core's vocab-parallel cross entropy
(`-CE = logprob`); the entropy uses the same max / sum-exp reductions over the TP group. Both are
differentiable (the PPO policy loss and the entropy bonus back-propagate through them) and equal on every
rank of the TP group. With a TP group of one the same quantities come from plain log-softmax pieces
(`local_token_logprobs`): megatron's kernel would still make three all-reduces and, through a boolean-mask
index, a device-to-host sync per call, the per-micro-batch overhead a small model feels most.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    tp_group: dist.ProcessGroup,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of `targets` under vocab-parallel `logits` (and optionally the entropy), in fp32.

    Args:
        logits: `[..., vocab_padded / tp]`, this rank's vocabulary slice (megatron's GPTModel output with
            `labels=None`, batch-first `[b, s, v/tp]`). For next-token log-probabilities pass
            `logits[:, :-1]` with `targets = tokens[:, 1:]`. Padding ids of the vocabulary must already be
            ~-inf there, as `megatron_adapters.model.build_gpt`'s output hook leaves them.
        targets: `[...]` global token ids.
        tp_group: the role's tensor-parallel group (`pg_collection.tp`).
        temperature: logits are divided by it (use the rollout's sampling temperature for PPO ratios).
        with_entropy: also return the entropy of the full distribution, `[...]`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature: {temperature} must be > 0; use 1.0 for the model's own distribution")
    if tp_group.size() == 1:
        if not torch.is_grad_enabled() and logits.dim() > 2:
            return _in_row_chunks(logits, targets, temperature, with_entropy)
        return local_token_logprobs(fp32_scaled(logits, temperature), targets, with_entropy)
    # Division makes a new fp32 tensor: megatron's cross entropy works in place on its input.
    scaled = logits.float() / temperature
    ce_input = scaled.clone() if with_entropy else scaled
    logprobs = -vocab_parallel_cross_entropy(ce_input, targets, tp_group=tp_group)
    if not with_entropy:
        return logprobs
    return logprobs, vocab_parallel_entropy(scaled, tp_group)


def local_token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` when one rank holds the whole vocabulary: log p = z_target - log Z, entropy
    log Z - sum_v p_v z_v. No collective, no host read; autograd keeps the logits and the probabilities."""
    log_z = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    if not with_entropy:
        return logprobs
    probs = (logits - log_z.unsqueeze(-1)).exp()
    return logprobs, log_z - (probs * logits).sum(-1)


def fp32_scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`logits.float() / temperature` with one full-vocabulary fp32 tensor, not two: a bf16 input's fp32 copy
    is divided in place (the cast's backward needs neither tensor); an fp32 input is never written to."""
    scaled = logits.float()
    if temperature == 1.0:
        return scaled
    return scaled / temperature if scaled is logits else scaled.div_(temperature)


# Forward-only passes take log-probs this many tokens at a time: their fp32 copies of the logits stay
# small next to the model-dtype logits of a large forward micro-batch (roles.<role>.forward_max_tokens).
CHUNK_TOKENS = 4096


def _in_row_chunks(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`local_token_logprobs` over groups of rows of `[b, s, v]` logits (no autograd: nothing is kept)."""
    step = max(1, CHUNK_TOKENS // logits.shape[1])
    parts = [local_token_logprobs(fp32_scaled(logits[i : i + step], temperature), targets[i : i + step],
                                  with_entropy)
             for i in range(0, logits.shape[0], step)]
    if not with_entropy:
        return torch.cat(parts)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def vocab_parallel_entropy(logits: torch.Tensor, tp_group: dist.ProcessGroup) -> torch.Tensor:
    """Entropy `-sum_v p_v log p_v` of softmax(logits) over the vocabulary split across `tp_group`.

    Uses `H = log Z - sum_v p_v z_v` with the max and the sums reduced over the TP group. The sums go
    through megatron's `reduce_from_tensor_model_parallel_region` (all-reduce forward, identity backward),
    which is the right gradient because every TP rank computes the same downstream loss.
    """
    logits = logits.float()
    with torch.no_grad():
        shift = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=tp_group)
    shifted = logits - shift
    exp = shifted.exp()
    sum_exp = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1), group=tp_group)
    weighted = reduce_from_tensor_model_parallel_region((exp * shifted).sum(dim=-1), group=tp_group)
    return sum_exp.log() - weighted / sum_exp
