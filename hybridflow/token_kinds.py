"""What each token of a sample is: the per-turn segments of a (possibly multi-turn) trajectory.

A sample is a prompt, then response-side turns: assistant tokens (sampled by the policy) and observation
tokens (a tool result or environment message, appended by the rollout). Every rollout result and step batch
carries a `token_kinds` [B, T] tensor (this module's `TokenKind` per column), from which the rest follows:

  seq_lens   [B]     prompt + every response-side token: positions, attention and packing read it
  loss_mask  [B, T]  1 on assistant tokens only: losses, KL, entropy, value targets and the parity gate read it
  segments           maximal runs of one kind on the response side; a turn is a run of assistant tokens
                     (an observation always lies between two turns)

A per-token tensor packs, slices by rows and moves through torch.distributed like the token ids do; padding
(kind 0) is what `torch.zeros` and right-padding with 0 give. A single-turn sample is one assistant segment.
"""

from __future__ import annotations

from enum import IntEnum

import torch


class TokenKind(IntEnum):
    PAD = 0  # after the sample's end
    PROMPT = 1
    ASSISTANT = 2  # sampled by the policy: trained on
    OBSERVATION = 3  # tool output / environment message: attended, never trained on


def prompt_kinds(prompt_lens: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] kinds of a prompt-only batch: PROMPT on each row's first `prompt_lens[b]` columns, else PAD."""
    cols = torch.arange(width, device=prompt_lens.device)
    return torch.where(cols[None, :] < prompt_lens[:, None], int(TokenKind.PROMPT), int(TokenKind.PAD)).long()


def sequence_lengths(kinds: torch.Tensor) -> torch.Tensor:
    """[B] tokens of each sample (prompt and every response-side token)."""
    return (kinds != TokenKind.PAD).sum(1)


def loss_mask(kinds: torch.Tensor) -> torch.Tensor:
    """[B, T] int64, 1 on the tokens the policy sampled (assistant tokens), 0 elsewhere."""
    return (kinds == TokenKind.ASSISTANT).long()


def response_extent(kinds: torch.Tensor) -> torch.Tensor:
    """[B, T] int64, 1 on every response-side token (assistant and observation): what a reward reads."""
    return ((kinds == TokenKind.ASSISTANT) | (kinds == TokenKind.OBSERVATION)).long()


def segment_spans(kinds_row: torch.Tensor) -> list[tuple[int, int, TokenKind]]:
    """The response-side segments of one row as (start, end, kind), end exclusive, in order."""
    spans: list[tuple[int, int, TokenKind]] = []
    for col, kind in enumerate(kinds_row.tolist()):
        if kind in (TokenKind.ASSISTANT, TokenKind.OBSERVATION):
            if spans and spans[-1][1] == col and spans[-1][2] == kind:
                spans[-1] = (spans[-1][0], col + 1, spans[-1][2])
            else:
                spans.append((col, col + 1, TokenKind(kind)))
    return spans


def turn_counts(kinds: torch.Tensor) -> torch.Tensor:
    """[B] assistant turns per row (runs of assistant tokens)."""
    assistant = kinds == TokenKind.ASSISTANT
    starts = assistant.clone()
    starts[:, 1:] &= ~assistant[:, :-1]
    return starts.sum(1)


def observation_share(kinds: torch.Tensor) -> float:
    """Observation tokens over all response-side tokens of the batch (0 for single-turn samples)."""
    response = int(response_extent(kinds).sum())
    return float((kinds == TokenKind.OBSERVATION).sum()) / response if response else 0.0
