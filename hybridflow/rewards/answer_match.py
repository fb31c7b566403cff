"""Reward by comparing the response with the row's reference `answer` (the built-in tasks' reward)."""

from __future__ import annotations

from hybridflow.errors import UserError
from hybridflow.rewards.inputs import RewardInputs, reads_row_fields


def char_match(response: str, answer: str) -> float:
    """Partial credit: characters equal at the same position / the longer length; 1.0 only on an exact match.

    Dividing by the longer length makes padding the answer with junk cost as much as leaving characters out.
    """
    response, answer = response.strip(), answer.strip()
    if not response and not answer:
        return 1.0
    same = sum(a == b for a, b in zip(response, answer, strict=False))
    return same / max(len(response), len(answer))


def _answers(batch: RewardInputs, fn_name: str) -> list[str]:
    try:
        return [str(row["answer"]) for row in batch.rows]
    except KeyError:
        raise UserError(
            f"reward.fn: {fn_name} needs an 'answer' field in each dataset row; "
            "add it or set another reward.fn"
        ) from None


@reads_row_fields("answer")
def answer_match(batch: RewardInputs) -> list[float]:
    """Per-position character credit in [0, 1] against `row["answer"]`."""
    return [char_match(r, a) for r, a in zip(batch.responses, _answers(batch, "answer_match"), strict=True)]


@reads_row_fields("answer")
def answer_exact(batch: RewardInputs) -> list[float]:
    """1.0 when the stripped response equals `row["answer"]`, else 0.0."""
    answers = _answers(batch, "answer_exact")
    return [float(r.strip() == a.strip()) for r, a in zip(batch.responses, answers, strict=True)]
