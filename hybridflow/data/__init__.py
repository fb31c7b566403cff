"""Prompt data: datasets, built-in tasks, a local character tokenizer, batching, resumable loading."""

from hybridflow.data.batching import PromptBatch, SFTBatch, collate_prompts, collate_sft
from hybridflow.data.loader import PromptLoader
from hybridflow.data.prompts import PromptDataset, fit_prompts, load_prompt_dataset
from hybridflow.data.tasks import (
    BUILTIN_ALPHABET,
    BUILTIN_TASKS,
    AddNumbers,
    SortDigits,
    builtin_task,
    is_builtin,
    task_rows,
)
from hybridflow.data.tokenizer import build_char_tokenizer, load_tokenizer

__all__ = [
    "BUILTIN_ALPHABET",
    "BUILTIN_TASKS",
    "AddNumbers",
    "PromptBatch",
    "PromptDataset",
    "PromptLoader",
    "SFTBatch",
    "SortDigits",
    "build_char_tokenizer",
    "builtin_task",
    "collate_prompts",
    "collate_sft",
    "fit_prompts",
    "is_builtin",
    "load_prompt_dataset",
    "load_tokenizer",
    "task_rows",
]
