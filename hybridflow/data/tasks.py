"""Built-in verifiable tasks, generated locally and deterministically from a seed.

Each example is a row {"prompt", "answer"}: the prompt is what the policy sees, the answer is the reference
the reward compares the response with, and prompt + answer (+ eos) is the supervised warm-up target.
Example i depends only on (seed, i), so any process regenerates the same dataset without files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hybridflow.errors import UserError

BUILTIN_PREFIX = "builtin:"
# Every character a built-in task writes: its character tokenizer needs nothing else (17 ids with specials).
BUILTIN_ALPHABET = "0123456789+=>"


@dataclass(frozen=True)
class SortDigits:
    """ "3142>" -> "1234": sort a random string of digits ascending."""

    min_digits: int = 3
    max_digits: int = 5

    def example(self, rng: random.Random) -> dict[str, str]:
        digits = [rng.choice("0123456789") for _ in range(rng.randint(self.min_digits, self.max_digits))]
        return {"prompt": "".join(digits) + ">", "answer": "".join(sorted(digits))}


@dataclass(frozen=True)
class AddNumbers:
    """ "17+25=" -> "42": add two non-negative integers."""

    max_value: int = 99

    def example(self, rng: random.Random) -> dict[str, str]:
        a, b = rng.randint(0, self.max_value), rng.randint(0, self.max_value)
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


@dataclass(frozen=True)
class MaxDigit:
    """ "31427>" -> "7": the largest digit. One answer token: quick to learn on a CPU, and RL has a clear
    signal once the warm-up has made the policy answer with a digit."""

    min_digits: int = 3
    max_digits: int = 6

    def example(self, rng: random.Random) -> dict[str, str]:
        digits = [rng.choice("0123456789") for _ in range(rng.randint(self.min_digits, self.max_digits))]
        return {"prompt": "".join(digits) + ">", "answer": max(digits)}


BuiltinTask = SortDigits | AddNumbers | MaxDigit
BUILTIN_TASKS: dict[str, BuiltinTask] = {"sort_digits": SortDigits(), "add": AddNumbers(), "max_digit": MaxDigit()}


def is_builtin(source: str) -> bool:
    """Whether `data.source` names a built-in task rather than a file."""
    return source.startswith(BUILTIN_PREFIX)


def builtin_task(source: str) -> BuiltinTask:
    """The task named by `data.source=builtin:<name>`."""
    name = source.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_TASKS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_TASKS)
        raise UserError(f"data.source: unknown built-in task {source!r}; set one of {known}")
    return BUILTIN_TASKS[name]


def task_rows(task: BuiltinTask, num_examples: int, seed: int) -> list[dict[str, str]]:
    """`num_examples` rows of `task`; row i is a function of (seed, i) only."""
    # A string seed is hashed with SHA-512 by `random`, so it is stable across processes and platforms.
    return [task.example(random.Random(f"{seed}:{i}")) for i in range(num_examples)]


def held_out_rows(task: BuiltinTask, num_examples: int, seed: int, num_train: int) -> list[dict[str, str]]:
    """`num_examples` rows whose prompts are not among the first `num_train` (the training set), drawn from
    indices past `num_train` so they are as deterministic as the training rows."""
    train = {row["prompt"] for row in task_rows(task, num_train, seed)}
    rows, i = [], num_train
    # A task with few distinct prompts could be exhausted; stop well past any sensible search.
    while len(rows) < num_examples and i < num_train + 100 * num_examples:
        row = task.example(random.Random(f"{seed}:{i}"))
        if row["prompt"] not in train:
            train.add(row["prompt"])  # no repeats inside the validation set either
            rows.append(row)
        i += 1
    if len(rows) < num_examples:
        raise UserError(f"data.val_size: the built-in task has only {len(rows)} prompts outside the training "
                        f"set; set data.val_size<={len(rows)} or data.val_source to a file")
    return rows
