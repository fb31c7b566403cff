"""GSM8K-style rule reward: the final number after `#### ` or inside `\\boxed{...}` must equal the reference.

Name it in config as `reward.fn=hybridflow.rewards.gsm8k:gsm8k`. The row's `answer` may be a bare number or
GSM8K's full worked solution ending in `#### 42`; both sides go through the same extraction.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from hybridflow.rewards.answer_match import _answers
from hybridflow.rewards.inputs import RewardInputs, reads_row_fields

# A number with optional sign, thousands commas and decimals; `$` and spaces GSM8K sometimes writes are allowed.
_NUMBER = r"-?\s*\$?\s*\d[\d,]*(?:\.\d+)?"
_FINAL = re.compile(rf"####\s*({_NUMBER})|\\boxed\{{\s*({_NUMBER})\s*\}}")


def extract_final_answer(text: str) -> str | None:
    """The last `#### <number>` or `\\boxed{<number>}` in `text`, normalised (no commas, `$`, spaces); else None.

    The last match wins because models often restate intermediate results in the same form before the end.
    """
    matches = _FINAL.findall(text)
    if not matches:
        return None
    hashes, boxed = matches[-1]
    raw = re.sub(r"[\s,$]", "", hashes or boxed)
    try:
        value = Decimal(raw)
    except InvalidOperation:
        return None
    # Decimal equality makes "42", "42.0" and "42.00" the same answer; normalize() drops trailing zeros.
    return format(value.normalize(), "f") if value != 0 else "0"


def _reference(answer: str) -> str | None:
    """The row's answer: a full solution's `#### n`, else the whole field read as one number."""
    found = extract_final_answer(answer)
    if found is not None:
        return found
    return extract_final_answer(f"#### {answer.strip()}")


def gsm8k_score(response: str, answer: str) -> float:
    """1.0 when the response's final answer equals the reference's, else 0.0 (also when either has none)."""
    got, want = extract_final_answer(response), _reference(answer)
    return float(got is not None and got == want)


@reads_row_fields("answer")
def gsm8k(batch: RewardInputs) -> list[float]:
    """Per-sample 0/1 reward against `row["answer"]`."""
    answers = _answers(batch, "gsm8k")
    return [gsm8k_score(r, a) for r, a in zip(batch.responses, answers, strict=True)]
