"""What a rule-based reward function receives and returns.

A reward function is any callable `fn(batch: RewardInputs) -> Sequence[float] | torch.Tensor` giving one
score per sample; it sees decoded text and token ids, plus the dataset rows (e.g. a reference answer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.errors import UserError


@dataclass(frozen=True)
class RewardInputs:
    prompts: list[str]
    responses: list[str]  # decoded without special tokens, cut at the first eos
    prompt_ids: list[list[int]]  # without padding
    response_ids: list[list[int]]  # without padding, up to and including eos when one was sampled
    rows: list[dict[str, Any]]  # the prompt's dataset row, once per sample

    def __len__(self) -> int:
        return len(self.responses)


RewardFn = Callable[[RewardInputs], Sequence[float] | torch.Tensor]


def reads_row_fields(*fields: str) -> Callable[[RewardFn], RewardFn]:
    """Mark a reward function with the dataset-row fields it reads (`fn.row_fields`): the run's preflight refuses
    a dataset whose rows lack one, before any process starts, instead of the first scoring failing on a rank."""

    def mark(fn: RewardFn) -> RewardFn:
        fn.row_fields = fields
        return fn

    return mark


def _unpad(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def reward_inputs(
    tokenizer: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    rows: list[dict[str, Any]],
) -> RewardInputs:
    """Decode padded [B, L] prompts and [B, T] responses (masks mark real tokens) into a `RewardInputs`."""
    prompts, responses = _unpad(prompt_ids, prompt_mask), _unpad(response_ids, response_mask)
    return RewardInputs(
        prompts=tokenizer.batch_decode(prompts, skip_special_tokens=True),
        responses=tokenizer.batch_decode(responses, skip_special_tokens=True),
        prompt_ids=prompts,
        response_ids=responses,
        rows=rows,
    )


def compute_scores(fn: RewardFn, batch: RewardInputs, name: str = "reward.fn") -> torch.Tensor:
    """Call `fn` and check it gave one finite number per sample; float32 [B]."""
    result = fn(batch)
    try:
        scores = torch.as_tensor(result, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        scores = None
    if scores is None or scores.dim() != 1:
        raise UserError(f"{name}: returned {_kind(result)}, not one number per sample; return a list of "
                        f"{len(batch)} floats or a 1-D tensor")
    if scores.numel() != len(batch):
        raise UserError(f"{name}: returned {scores.numel()} scores for {len(batch)} samples; return one each")
    if not torch.isfinite(scores).all():
        raise UserError(f"{name}: returned a NaN or infinite score; return finite numbers")
    return scores


def _kind(result: Any) -> str:
    """What a reward function returned, in words: 'None', 'a dict', 'a list of str', 'a tensor of shape (2, 1)'."""
    if result is None:
        return "None"
    if hasattr(result, "shape"):  # a tensor or an array
        kind = "tensor" if isinstance(result, torch.Tensor) else type(result).__name__
        return f"a {kind} of shape {tuple(result.shape)}"
    if isinstance(result, list | tuple):
        items = sorted({type(x).__name__ for x in result})
        return f"a {type(result).__name__} of {', '.join(items)}"
    return f"a {type(result).__name__}"
