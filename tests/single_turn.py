"""Test batches in the single-turn shape: token kinds from prompt lengths and a response mask."""

from __future__ import annotations

import torch

from hybridflow.token_kinds import TokenKind, prompt_kinds


def single_turn_kinds(prompt_lens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] kinds: PROMPT on each row's prompt columns, ASSISTANT where `response_mask` is set, else PAD."""
    kinds = prompt_kinds(torch.as_tensor(prompt_lens), response_mask.shape[1])
    return torch.where(response_mask.bool(), int(TokenKind.ASSISTANT), kinds)
