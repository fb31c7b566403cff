"""Log-probabilities of given tokens and entropy from vocab-parallel logits, without a full-vocab gather.

A tensor-parallel LM head leaves each TP rank with logits for its slice of the (padded) vocabulary,
`[..., vocab_padded / tp]`. `ChunkedLogprobs` computes log p(target) = z_t - log Z and the entropy
H = log Z - sum_v p_v z_v from that slice, a chunk of tokens at a time, with the max, the sums and the target's
logit reduced over the TP group (2 all-reduces per chunk; none at TP 1, and no host read), and differentiates them
by hand. Both are equal on every rank of the TP group and differentiable (the PPO policy loss and the entropy bonus
back-propagate through them).

`compiled=True` runs each chunk's two vocabulary-wide steps (the exp sums of the forward, the gradient of the
backward) as kernels torch.compile fuses: each reads the model-dtype logits once instead of making ~6 fp32 passes
over the chunk. Same math, another summation order (fp32-close, a test ties them); off by default.

Why not megatron-core's `vocab_parallel_cross_entropy` plus autograd through an entropy: both work on fp32 copies
of the whole micro-batch's logits and autograd keeps them and the probabilities for backward, ~20 bytes per logit
at the backward's peak. At a 16k-token micro-batch and a 128k vocabulary that is ~40 GB: an H100 run went out of
memory there (benchmarks/results/race_h100_20261205/). Here backward keeps the logits in their own dtype and two
fp32 numbers per token, and writes the gradient in the logits' dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    tp_group: dist.ProcessGroup,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    compiled: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of `targets` under vocab-parallel `logits` (and optionally the entropy), in fp32.

    Args:
        logits: `[b, s, vocab_padded / tp]`, this rank's vocabulary slice (megatron's GPTModel output with
            `labels=None`). For next-token log-probabilities pass `logits[:, :-1]` with
            `targets = tokens[:, 1:]`. Padding ids of the vocabulary must already be a large finite negative
            number there, as `megatron_adapters.model.build_gpt`'s output hook leaves them.
        targets: `[b, s]` global token ids.
        tp_group: the role's tensor-parallel group (`pg_collection.tp`).
        temperature: logits are divided by it (use the rollout's sampling temperature for PPO ratios).
        with_entropy: also return the entropy of the full distribution, `[b, s]`.
        compiled: the chunks' vocabulary-wide steps as torch.compile'd kernels (see the module docstring).
    """
    if temperature <= 0:
        raise ValueError(f"temperature: {temperature} must be > 0; use 1.0 for the model's own distribution")
    logprobs, entropy = ChunkedLogprobs.apply(logits, targets, temperature, tp_group, compiled)
    return (logprobs, entropy) if with_entropy else logprobs


# Log-probs are computed this many tokens at a time: the fp32 work tensors of a chunk ([chunk, vocab shard], a few
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


def exp_sums(logits: torch.Tensor, top: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_v e_v, sum_v e_v z_v) with z = logits / temperature in fp32 and e = exp(z - top), over the last dim."""
    z = _scaled(logits, temperature)
    e = (z - top.unsqueeze(-1)).exp_()
    return e.sum(-1), e.mul_(z).sum(-1)


def logit_grad(logits: torch.Tensor, log_z: torch.Tensor, entropy: torch.Tensor, g_t: torch.Tensor,
               g_h: torch.Tensor, local_targets: torch.Tensor, at_target: torch.Tensor, temperature: float
               ) -> torch.Tensor:
    """d loss / d logits of one chunk, in the logits' dtype (see ChunkedLogprobs; g_t, g_h already / temperature)."""
    log_p = _scaled(logits, temperature) - log_z.unsqueeze(-1)  # a new tensor: in place from here
    p = log_p.exp()
    # -p (g_t + g_H (log p + H)), then + g_t at the target where this shard holds it
    dz = log_p.add_(entropy.unsqueeze(-1)).mul_(-g_h).sub_(g_t).mul_(p)
    return dz.scatter_add_(-1, local_targets.unsqueeze(-1), at_target).to(logits.dtype)


@functools.cache
def _kernels(compiled: bool):
    """(exp_sums, logit_grad), eager or torch.compile'd (compiled once per process, shapes dynamic: the chunks'
    token counts vary)."""
    if not compiled:
        return exp_sums, logit_grad
    return torch.compile(exp_sums, dynamic=True), torch.compile(logit_grad, dynamic=True)


def _all_reduce(t: torch.Tensor, group: dist.ProcessGroup, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if group.size() > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


class ChunkedLogprobs(torch.autograd.Function):
    """Log-probabilities of `targets` and entropies under `logits / temperature` (this rank's vocabulary shard of
    [b, s, vocab]) -> two [b, s] fp32 tensors, equal on every rank of `tp_group`.

    Forward, per chunk: the shard's max, then one all-reduce of (sum exp, sum exp * z, the target's logit where
    this shard holds the target) give log Z, H = log Z - sum_v p_v z_v and log p_t = z_t - log Z. Backward keeps
    only the logits (their own dtype; a view is fine) and log Z and H per token, recomputes each chunk's
    probabilities, and needs no collective: with p = softmax(z), g_t and g_H the incoming gradients of log p_t
    and H (the same on every rank, as the loss is),
      d log p_t / dz = onehot(t) - p,   dH / dz = -p (log p + H),   d / dlogits = (d / dz) / temperature.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, tp_group: dist.ProcessGroup,
                compiled: bool = False):
        shard = logits.shape[-1]
        first = tp_group.rank() * shard  # the global id of this shard's first column
        shape = logits.shape[:-1]
        logprobs = torch.empty(shape, dtype=torch.float32, device=logits.device)
        entropy, log_z = torch.empty_like(logprobs), torch.empty_like(logprobs)
        local_targets = targets - first
        held = (local_targets >= 0) & (local_targets < shard)
        local_targets = torch.where(held, local_targets, 0)
        sums_of = _kernels(compiled)[0]
        for block in token_chunks(shape):
            chunk = logits[block]
            # max and gather on the model-dtype logits: dividing by temperature > 0 commutes with both, exactly
            top = _all_reduce(_scaled(chunk.amax(dim=-1), temperature), tp_group, dist.ReduceOp.MAX)
            picked = _scaled(chunk.gather(-1, local_targets[block].unsqueeze(-1)).squeeze(-1), temperature)
            z_t = torch.where(held[block], picked, 0.0)
            sums = _all_reduce(torch.stack([*sums_of(chunk, top, temperature), z_t]), tp_group)
            lz = top + sums[0].log()
            logprobs[block] = sums[2] - lz
            entropy[block] = lz - sums[1] / sums[0]
            log_z[block] = lz
        ctx.temperature, ctx.compiled = temperature, compiled
        ctx.save_for_backward(logits, local_targets, held, log_z, entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor, grad_entropy: torch.Tensor):
        logits, local_targets, held, log_z, entropy = ctx.saved_tensors
        t = ctx.temperature
        grad_of = _kernels(ctx.compiled)[1]
        grad = torch.empty_like(logits)
        for block in token_chunks(logits.shape[:-1]):
            # the 1 / temperature of d / dlogits goes on the per-token gradients, not on the [chunk, vocab] tensor
            g_t, g_h = grad_logprobs[block].unsqueeze(-1) / t, grad_entropy[block].unsqueeze(-1) / t
            at_target = torch.where(held[block].unsqueeze(-1), g_t, 0.0)
            grad[block] = grad_of(logits[block], log_z[block], entropy[block], g_t, g_h, local_targets[block],
                                  at_target, t)
        return grad, None, None, None, None
