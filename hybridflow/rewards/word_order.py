"""Rule reward of the built-in `word_order` task: the response's last non-empty line, read as a list of words,
must equal the reference list.

Name it in config as `reward.fn=hybridflow.rewards.word_order:word_order`. Words are compared lower-case, split
on commas and whitespace, so "ant, Cat,cow" and "ant cat cow" are the same list; order and count must match.
A trailing full stop is ignored. Only the last line counts, so restating the unordered words first costs nothing,
while a list followed by more text is not an answer.
"""

from __future__ import annotations

import re

from hybridflow.rewards.answer_match import _answers
from hybridflow.rewards.inputs import RewardInputs, reads_row_fields


def final_words(text: str) -> tuple[str, ...] | None:
    """The words of the last non-empty line of `text`, lower-case; None when there is none."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    words = tuple(w for w in re.split(r"[\s,]+", lines[-1].strip().rstrip(".").lower()) if w)
    return words or None


def word_order_score(response: str, answer: str) -> float:
    """1.0 when the response's last line lists the reference's words in its order, else 0.0."""
    got = final_words(response)
    return float(got is not None and got == final_words(answer))


@reads_row_fields("answer")
def word_order(batch: RewardInputs) -> list[float]:
    """Per-sample 0/1 reward against `row["answer"]`."""
    answers = _answers(batch, "word_order")
    return [word_order_score(r, a) for r, a in zip(batch.responses, answers, strict=True)]
