"""Token tensors from text: right-padded prompts for generation and prompt + answer for SFT."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.errors import UserError


@dataclass
class PromptBatch:
    """Prompts right-padded: row b holds its prompt at columns [0, len_b), so the response can follow it
    directly and causal attention needs no padding mask (see hybridflow.rollout.base)."""

    input_ids: torch.Tensor  # [B, L] int64, pad id after each prompt
    attention_mask: torch.Tensor  # [B, L] int64, 1 on prompt tokens
    rows: list[dict[str, Any]] = field(
        default_factory=list
    )  # the dataset rows (reference fields for rewards)

    @property
    def prompt_lens(self) -> torch.Tensor:
        return self.attention_mask.sum(dim=1)


@dataclass
class SFTBatch:
    """prompt + target + eos, right-padded. `loss_mask[b, t]` = 1 where token t is a target token, so the
    logits at t - 1 are trained to predict it."""

    input_ids: torch.Tensor  # [B, L] int64
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L] float32


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def collate_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_prompt_length: int,
    rows: list[dict[str, Any]] | None = None,
    total_len: int | None = None,
) -> PromptBatch:
    """Tokenize (with the tokenizer's own special tokens, e.g. Llama's bos) and right-pad to `total_len`
    columns (prompt + room for the response), or to the longest prompt."""
    encoded = tokenizer(list(prompts))["input_ids"]
    longest = max(len(ids) for ids in encoded)
    if longest > max_prompt_length:
        raise UserError(
            f"data.max_prompt_length: a prompt has {longest} tokens, more than {max_prompt_length}; raise it "
            "(datasets drop such prompts when loaded through PromptLoader)"
        )
    width = total_len or longest
    input_ids = torch.full((len(encoded), width), _pad_id(tokenizer), dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, ids in enumerate(encoded):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    return PromptBatch(input_ids, attention_mask, list(rows) if rows is not None else [])


def collate_sft(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], targets: Sequence[str], max_length: int
) -> SFTBatch:
    """Teacher-forcing batch for the supervised warm-up: loss on the target tokens and the closing eos."""
    seqs, masks = [], []
    for prompt, target in zip(prompts, targets, strict=True):
        prompt_ids = tokenizer(prompt)["input_ids"]
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(prompt_ids) + len(target_ids) > max_length:
            raise UserError(
                f"data.seq_length: prompt + answer needs {len(prompt_ids) + len(target_ids)} tokens, "
                f"more than {max_length}; raise data.seq_length"
            )
        seqs.append(prompt_ids + target_ids)
        masks.append([0.0] * len(prompt_ids) + [1.0] * len(target_ids))
    longest = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), longest), _pad_id(tokenizer), dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), longest), dtype=torch.float32)
    for i, (ids, mask) in enumerate(zip(seqs, masks, strict=True)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        loss_mask[i, : len(ids)] = torch.tensor(mask)
    return SFTBatch(input_ids, attention_mask, loss_mask)
