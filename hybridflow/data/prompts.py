"""Prompt datasets: rows from a local .jsonl/.parquet file or a built-in task, with a named prompt field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from hybridflow.data.chat import is_chat
from hybridflow.data.tasks import builtin_task, is_builtin, task_rows
from hybridflow.errors import UserError

Row = dict[str, Any]


@dataclass(frozen=True)
class PromptDataset:
    """Rows in file order; `prompt_key` names the field holding the prompt text. Other fields (e.g. a
    reference answer) ride along to the reward function."""

    rows: list[Row]
    prompt_key: str = "prompt"

    def __len__(self) -> int:
        return len(self.rows)

    def prompt(self, index: int) -> str:
        return self.rows[index][self.prompt_key]


def _read_jsonl(path: Path, field: str) -> list[Row]:
    rows = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise UserError(
                    f"{field}: {path}:{line_no} is not UTF-8 text ({err.reason}: byte {raw[err.start]:#04x} at "
                    f"column {err.start + 1}); save the file as UTF-8 JSON Lines"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{field}: {path}:{line_no} is not valid JSON ({err.msg}); fix the line") from None
            if not isinstance(row, dict):
                raise UserError(f"{field}: {path}:{line_no} is not a JSON object; write one object per line")
            rows.append(row)
    return rows


def _read_parquet(path: Path, field: str) -> list[Row]:
    try:
        import pyarrow.parquet as pq
        from pyarrow import ArrowException
    except ImportError:
        raise UserError(f"{field}: reading {path.name} needs pyarrow; run `pip install pyarrow`") from None
    try:
        return pq.read_table(path).to_pylist()
    except ArrowException as err:
        reason = " ".join(str(err).split())
        raise UserError(f"{field}: {path} is not a readable Parquet file ({reason}); point {field} at a Parquet "
                        "file (e.g. written by pandas.DataFrame.to_parquet) or a .jsonl") from None


READERS = {".jsonl": _read_jsonl, ".parquet": _read_parquet}


def _check_prompts(rows: list[Row], prompt_key: str, source: str, field: str) -> None:
    if not rows:
        raise UserError(f"{field}: {source} has no rows; point {field} at a non-empty dataset")
    for index, row in enumerate(rows):
        if prompt_key not in row:
            fields = ", ".join(sorted(row)) or "none"
            raise UserError(
                f"data.prompt_key: row {index + 1} of {source} has no field {prompt_key!r} (fields: {fields}); "
                "set data.prompt_key to the field holding the prompt"
            )
        if not isinstance(row[prompt_key], str) and not is_chat(row[prompt_key]):
            raise UserError(
                f"data.prompt_key: field {prompt_key!r} of row {index + 1} of {source} is "
                f"{type(row[prompt_key]).__name__}, not text or a list of {{role, content}} messages; "
                "point data.prompt_key at such a field"
            )


def load_prompt_dataset(
    source: str, prompt_key: str = "prompt", seed: int = 0, num_builtin_examples: int = 8192,
    field: str = "data.source",
) -> PromptDataset:
    """Rows of `source`: `builtin:<task>` (generated from `seed`, field "prompt") or .jsonl/.parquet. `field` is
    the config field that names it (`data.source`, `data.val_source`), which the error messages name."""
    if is_builtin(source):
        return PromptDataset(task_rows(builtin_task(source), num_builtin_examples, seed), "prompt")
    path = Path(source)
    if path.suffix not in READERS:
        raise UserError(
            f"{field}: {source!r} is neither builtin:<task> nor a .jsonl/.parquet file; set one of those"
        )
    if not path.is_file():
        raise UserError(f"{field}: file {source!r} does not exist; set a local .jsonl/.parquet path")
    rows = READERS[path.suffix](path, field)
    _check_prompts(rows, prompt_key, source, field)
    return PromptDataset(rows, prompt_key)


def fit_prompts(
    dataset: PromptDataset,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int,
    overlong: str = "drop",
    source: str = "data.source",
) -> tuple[PromptDataset, int]:
    """The rows whose tokenized prompt fits `max_prompt_length` tokens, and how many were dropped.

    `overlong` is `data.overlong_prompts`: "error" refuses a dataset with any prompt too long, "drop" drops them;
    a dataset with none left is refused either way. `source` names the dataset in the message.
    """
    lengths = [len(ids) for ids in tokenizer([r[dataset.prompt_key] for r in dataset.rows])["input_ids"]]
    kept = [row for row, n in zip(dataset.rows, lengths, strict=True) if n <= max_prompt_length]
    over = len(dataset.rows) - len(kept)
    if not kept:
        raise UserError(
            f"data.max_prompt_length: all {len(lengths)} prompts of {source} are longer than {max_prompt_length} "
            f"tokens (shortest {min(lengths)}, longest {max(lengths)}); raise data.max_prompt_length to at least "
            f"{min(lengths)}"
        )
    if over and overlong == "error":
        raise UserError(
            f"data.max_prompt_length: {over} of {len(lengths)} prompts of {source} are longer than "
            f"{max_prompt_length} tokens (longest {max(lengths)}) and data.overlong_prompts=error; raise "
            f"data.max_prompt_length to {max(lengths)}, or set data.overlong_prompts=drop to train without them"
        )
    return PromptDataset(kept, dataset.prompt_key), over
