"""An endless, resumable stream of prompt batches: a fresh seeded shuffle each epoch."""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.data.batching import PromptBatch, collate_prompts
from hybridflow.data.chat import render_chat_rows
from hybridflow.data.prompts import PromptDataset, fit_prompts
from hybridflow.errors import UserError


class PromptLoader:
    """Yields `batch_size` rows at a time. The order is a function of (seed, epoch) only, so the position
    (epoch, index) in `state_dict` is all a checkpoint needs to continue the exact same sequence."""

    def __init__(
        self,
        dataset: PromptDataset,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        max_prompt_length: int,
        seed: int = 0,
        shuffle: bool = True,
        overlong_prompts: str = "drop",
        tools: list[dict[str, Any]] | None = None,
    ):
        # Chat prompts become template text here, where the tokenizer is known; later stages see only strings.
        # `tools`: the rollout environment's tool schemas (hybridflow.tools.environment_tools), rendered too.
        dataset = PromptDataset(render_chat_rows(dataset.rows, dataset.prompt_key, tokenizer, tools),
                                dataset.prompt_key)
        self.num_rows = len(dataset)  # before dropping over-long prompts
        self.dataset, self.num_dropped = fit_prompts(dataset, tokenizer, max_prompt_length, overlong_prompts)
        if not 0 < batch_size <= len(self.dataset):
            dropped = (f" ({self.num_dropped} longer than data.max_prompt_length={max_prompt_length} dropped)"
                       if self.num_dropped else "")
            raise UserError(
                f"data.train_batch_size: {batch_size} prompts per step but the dataset has "
                f"{len(self.dataset)} usable prompts{dropped}; set 1..{len(self.dataset)}"
            )
        self.tokenizer, self.batch_size, self.max_prompt_length = tokenizer, batch_size, max_prompt_length
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._epoch_order()

    def warmup_loader(self) -> PromptLoader:
        """The supervised warm-up's rows: the same prompts (rendered and fitted once, here) in the next seed's
        order, from the start."""
        other = copy.copy(self)
        other.seed, other.epoch, other.index = self.seed + 1, 0, 0
        other._order = other._epoch_order()
        return other

    def _epoch_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def next_rows(self) -> list[dict[str, Any]]:
        """The next `batch_size` rows; an epoch's incomplete tail is skipped so every batch is full."""
        if self.index + self.batch_size > len(self._order):
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._epoch_order()
        picked = self._order[self.index : self.index + self.batch_size]
        self.index += self.batch_size
        return [self.dataset.rows[i] for i in picked]

    def next_batch(self) -> PromptBatch:
        """The next rows as a right-padded prompt batch."""
        rows = self.next_rows()
        prompts = [row[self.dataset.prompt_key] for row in rows]
        return collate_prompts(self.tokenizer, prompts, self.max_prompt_length, rows)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "num_rows": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        check_prompt_count(state["num_rows"], len(self.dataset))
        self.seed, self.epoch, self.index = state["seed"], state["epoch"], state["index"]
        self._order = self._epoch_order()


def check_prompt_count(saved: int, now: int) -> None:
    """A resumed run goes on with the checkpoint's pass over the prompts: the usable-prompt count must be the
    one the checkpoint's loader had (`saved`, its state's num_rows)."""
    if saved != now:
        raise UserError(f"trainer.resume: the checkpoint's dataset had {saved} prompts, this one has {now}; resume "
                        "with the same data.source, or trainer.resume=never")
