"""Prompt data and reward function."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.bounds import bounded

OVERLONG_PROMPTS = ("drop", "error")
# Training widths are rounded up to this many columns (the step's batch, StepBatch.trim_columns, and each length
# class of the micro-batches): divisible by any TP degree sequence parallelism splits a sequence over (the planner
# checks it), few distinct shapes.
TRIM_MULTIPLE = 64


@dataclass
class DataConfig:
    source: str = "builtin:add"  # "builtin:<task>" or a local .jsonl / .parquet path
    prompt_key: str = "prompt"
    tokenizer: str | None = None  # local HF tokenizer dir; None = built-in character tokenizer
    max_prompt_length: int = bounded(32, ge=1)
    # Prompts longer than max_prompt_length tokens (after the chat template): "drop" them (counted before
    # launch; verl's recipes filter them too) or "error" (refuse the run before launch).
    overlong_prompts: str = bounded("drop", choices=OVERLONG_PROMPTS)
    train_batch_size: int = bounded(8, ge=1)  # prompts per step
    seq_length: int = bounded(64, ge=2)  # prompt + response tokens per sample (training sequence length)
    # Validation prompts (trainer.val_every / val_before_train): a .jsonl/.parquet path, or None = a held-out
    # split of a builtin:<task> source (prompts disjoint from the training set).
    val_source: str | None = None
    val_size: int = bounded(64, ge=1)  # validation prompts (the first val_size rows of val_source)


@dataclass
class RewardConfig:
    fn: str | None = None  # "pkg.module:function", rule-based reward
    use_model: bool = False  # True: a reward model on the `reward` role's GPUs
