"""The step's batch: every per-sample and per-token tensor of one RL step, whole, on every rank.

All token tensors are [B, T], right-padded (see hybridflow.rollout.base): column t of a per-token
quantity is about token t (its log-prob, the value of the state before it, its reward). Once generated, a
batch's `token_kinds` say what each token is (hybridflow.token_kinds): its lengths (`seq_lens`, prompt and
every response-side token) and its `loss_mask` (assistant tokens only) both follow from them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

import hybridflow.token_kinds as kinds


@dataclass
class StepBatch:
    rows: list[dict[str, Any]]  # dataset rows, one per sample (a prompt's row repeats for its n samples)
    tokens: torch.Tensor
    prompt_lens: torch.Tensor  # [B]
    token_kinds: torch.Tensor | None = None  # [B, T] a TokenKind per column; None before generation
    rollout_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    scores: torch.Tensor | None = None  # [B]
    env_rewards: torch.Tensor | None = None  # [B] a multi-turn environment's reward, NaN where it gave none
    token_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None  # truncated importance weights (algorithm.tis_cap > 0)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_lens(self) -> torch.Tensor:
        """[B] int64: each sample's prompt + response-side tokens (assistant and observation)."""
        return kinds.sequence_lengths(self.token_kinds)

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, T] int64: 1 on the tokens the policy sampled, the only ones losses, KL and the gate read."""
        return kinds.loss_mask(self.token_kinds)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling: a batch saved in a lag-1 checkpoint before token kinds held a `response_mask` (a single
        turn right after the prompt); its kinds are rebuilt from it, so such a checkpoint still resumes."""
        if "response_mask" in state:
            mask = state.pop("response_mask")
            prompt = kinds.prompt_kinds(state["prompt_lens"], state["tokens"].shape[1])
            state["token_kinds"] = None if mask is None else torch.where(
                mask.bool(), int(kinds.TokenKind.ASSISTANT), prompt)
        self.__dict__.update(state)

    def trim_columns(self, multiple: int, max_len: int) -> None:
        """Drop the all-padding columns after the longest sample (`seq_lens`), keeping the width a
        multiple of `multiple` (at most `max_len`): training and inference then run on real tokens, not on
        the room reserved for prompts and responses that turned out shorter."""
        width = trimmed_width(int(self.seq_lens.max()), multiple, min(max_len, self.tokens.shape[1]))
        self.tokens = self.tokens[:, :width]
        self.token_kinds = self.token_kinds[:, :width]
        if self.rollout_logprobs is not None:  # None on steps that read no rollout log-probs
            self.rollout_logprobs = self.rollout_logprobs[:, :width]

    def tensors(self, *names: str, rows: slice | torch.Tensor = slice(None)) -> dict[str, torch.Tensor]:
        """Named tensors (tokens as `input_ids`; `loss_mask` and `seq_lens` too) restricted to `rows`, for a
        role's micro-batches; once generated, also each row's true length `seq_lens` (prompt and every
        response-side token), which sequence packing and positions read."""
        out = {"input_ids": self.tokens[rows]}
        if self.token_kinds is not None:
            out["seq_lens"] = kinds.sequence_lengths(self.token_kinds[rows])
        for name in names:
            out[name] = getattr(self, name)[rows]
        return out

    def select(self, rows: torch.Tensor) -> StepBatch:
        """The samples at the boolean or index tensor `rows` (every set field, same order)."""
        index = rows.nonzero()[:, 0] if rows.dtype == torch.bool else rows
        picked = {f.name: getattr(self, f.name)[index] for f in fields(self)
                  if f.name != "rows" and getattr(self, f.name) is not None}
        return StepBatch(rows=[self.rows[i] for i in index.tolist()], **picked)


def trimmed_width(used: int, multiple: int, limit: int) -> int:
    """The columns kept for rows whose longest is `used`: rounded up to a multiple of `multiple`, at most `limit`."""
    return min(limit, -(-used // multiple) * multiple)


def concat_batches(batches: list[StepBatch]) -> StepBatch:
    """One batch of the samples of `batches`, in order. Token tensors of different widths (each batch was
    trimmed to its own longest sample) are right-padded with 0 to the widest: the columns added lie after
    every sample's end, where the kind is PAD (so the loss mask is 0) and a causal model's outputs are never read."""
    width = max(b.tokens.shape[1] for b in batches)
    out: dict[str, Any] = {"rows": [row for b in batches for row in b.rows]}
    for f in fields(StepBatch):
        parts = [getattr(b, f.name) for b in batches]
        if f.name == "rows" or parts[0] is None:
            continue
        if parts[0].dim() == 2:
            parts = [pad_columns(p, width, 0) for p in parts]
        out[f.name] = torch.cat(parts)
    return StepBatch(**out)


def pad_columns(x: torch.Tensor, total_len: int, value: float) -> torch.Tensor:
    """Right-pad [B, L] to [B, total_len]."""
    return torch.nn.functional.pad(x, (0, total_len - x.shape[1]), value=value)
