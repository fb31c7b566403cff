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
        logprobs, entropy = ChunkedLogprobs.apply(logits, targets, temperature)
        return (logprobs, entropy) if with_entropy else logprobs
    # Division makes a new fp32 tensor: megatron's cross entropy works in place on its input.
    scaled = logits.float() / temperature
    ce_input = scaled.clone() if with_entropy else scaled
    logprobs = -vocab_parallel_cross_entropy(ce_input, targets, tp_group=tp_group)
    if not with_entropy:
        return logprobs
    return logprobs, vocab_parallel_entropy(scaled, tp_group)


# Log-probs are computed this many tokens at a time: the fp32 work tensors of a chunk ([chunk, vocab], a few
# of them: 0.5 GiB each at a 128k vocabulary) stay small next to the model-dtype logits of a large micro-batch.
CHUNK_TOKENS = 1024


def token_chunks(shape: torch.Size) -> list[tuple[slice, slice]]:
    """(rows, columns) blocks of at most ~CHUNK_TOKENS tokens covering `shape` [b, s, ...]: whole rows while a
    row fits, else pieces of one row (a packed micro-batch is one long row)."""
    b, s = shape[0], shape[1]
    if s <= CHUNK_TOKENS:
        step = CHUNK_TOKENS // max(s, 1)  # an empty packed micro-batch has s = 0
        return [(slice(i, i + step), slice(None)) for i in range(0, b, step)]
    return [(slice(i, i + 1), slice(j, j + CHUNK_TOKENS)) for i in range(b) for j in range(0, s, CHUNK_TOKENS)]


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 `logits / temperature`, never written to afterwards (`.float()` of fp32 logits is the logits)."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


class ChunkedLogprobs(torch.autograd.Function):
    """Log-probabilities of `targets` and entropies under `logits / temperature` ([b, s, vocab] -> two [b, s]
    fp32 tensors) when one rank holds the whole vocabulary: log p_t = z_t - log Z, H = log Z - sum_v p_v z_v.

    Computed in fp32 over `token_chunks`, and differentiated by hand: backward keeps only the logits (in their
    own dtype, a view is fine) and log Z and H per token, and recomputes each chunk's probabilities. Autograd
    through the plain formula would keep fp32 copies of the logits and the probabilities ([b, s, vocab] x 8
    bytes) and peak near 20 bytes per logit in backward: at 16k tokens and a 128k vocabulary ~40 GB, where this
    keeps the bf16 logits and writes their bf16 gradient (4 bytes per logit). No collective, no host read.

    Gradients, with p = softmax(z), g_t and g_H the incoming gradients of log p_t and H:
      d log p_t / dz = onehot(t) - p,   dH / dz = -p (log p + H),   d / dlogits = (d / dz) / temperature.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float):
        shape = logits.shape[:-1]
        logprobs = torch.empty(shape, dtype=torch.float32, device=logits.device)
        entropy, log_z = torch.empty_like(logprobs), torch.empty_like(logprobs)
        for block in token_chunks(shape):
            z = _scaled(logits[block], temperature)
            lz = torch.logsumexp(z, dim=-1)
            logprobs[block] = z.gather(-1, targets[block].unsqueeze(-1)).squeeze(-1) - lz
            entropy[block] = lz - (z - lz.unsqueeze(-1)).exp_().mul_(z).sum(-1)
            log_z[block] = lz
        ctx.temperature = temperature
        ctx.save_for_backward(logits, targets, log_z, entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor, grad_entropy: torch.Tensor):
        logits, targets, log_z, entropy = ctx.saved_tensors
        t = ctx.temperature
        grad = torch.empty_like(logits)
        for block in token_chunks(logits.shape[:-1]):
            log_p = _scaled(logits[block], t) - log_z[block].unsqueeze(-1)  # a new tensor: in place from here
            p = log_p.exp()
            # the 1 / temperature of d / dlogits goes on the per-token gradients, not on the [chunk, vocab] tensor
            g_t, g_h = grad_logprobs[block].unsqueeze(-1) / t, grad_entropy[block].unsqueeze(-1) / t
            # -p (g_t + g_H (log p + H)), then + g_t at the target
            dz = log_p.add_(entropy[block].unsqueeze(-1)).mul_(-g_h).sub_(g_t).mul_(p)
            grad[block] = dz.scatter_add_(-1, targets[block].unsqueeze(-1), g_t)
        return grad, None, None


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
