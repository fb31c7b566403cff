import json

import pytest

from hybridflow.data import AddNumbers, SortDigits, builtin_task, load_prompt_dataset, task_rows
from hybridflow.errors import UserError


def test_rows_are_a_function_of_seed_and_index():
    task = builtin_task("builtin:sort_digits")
    a, b = task_rows(task, 50, seed=3), task_rows(task, 80, seed=3)
    assert a == b[:50]
    assert a != task_rows(task, 50, seed=4)
    assert len({r["prompt"] for r in a}) > 40  # varied, not one example repeated


def test_sort_digits_answers():
    for row in task_rows(SortDigits(min_digits=2, max_digits=7), 200, seed=0):
        digits = row["prompt"].removesuffix(">")
        assert row["prompt"].endswith(">") and digits.isdigit() and 2 <= len(digits) <= 7
        assert row["answer"] == "".join(sorted(digits))


def test_add_answers():
    for row in task_rows(AddNumbers(max_value=999), 200, seed=1):
        a, b = row["prompt"].removesuffix("=").split("+")
        assert int(row["answer"]) == int(a) + int(b) and int(a) <= 999


def test_builtin_dataset_and_unknown_task():
    ds = load_prompt_dataset("builtin:add", seed=5, num_builtin_examples=10)
    assert len(ds) == 10 and ds.prompt(0) == ds.rows[0]["prompt"]
    with pytest.raises(UserError, match="builtin:sort_digits"):
        builtin_task("builtin:chess")


def test_word_problems_are_chat_with_checkable_gsm8k_answers():
    import ast
    import re

    from hybridflow.data.tasks import WORD_PROBLEM_EXAMPLE, WORD_PROBLEM_SYSTEM, held_out_rows
    from hybridflow.rewards.gsm8k import extract_final_answer, gsm8k_score

    task = builtin_task("builtin:gsm8k_easy")
    rows = task_rows(task, 300, seed=2)
    assert rows == task_rows(task, 300, seed=2) and rows != task_rows(task, 300, seed=3)
    for row in rows:
        system, *example, user = row["prompt"]
        assert system == {"role": "system", "content": WORD_PROBLEM_SYSTEM} and "####" in system["content"]
        assert tuple(example) == WORD_PROBLEM_EXAMPLE and example[1]["content"].endswith("#### 7")
        assert user["role"] == "user" and user["content"].endswith("?")
        work, final = row["answer"].split("\n")
        expression, value = work.split(" = ")
        # Independent check: Python's own arithmetic on the worked expression (`/` is exact by construction).
        tree = ast.parse(expression.replace("/", "//"), mode="eval")
        assert all(isinstance(n, (ast.Expression, ast.BinOp, ast.Constant, ast.operator)) for n in ast.walk(tree))
        assert eval(compile(tree, "<expr>", "eval")) == int(value) >= 0  # noqa: S307 - checked AST of + - * //
        assert final == f"#### {value}" and extract_final_answer(row["answer"]) == value
        # Every number of the worked solution is in the question, and at most two operations are needed.
        assert set(re.findall(r"\d+", expression)) <= set(re.findall(r"\d+", user["content"]))
        assert 1 <= sum(expression.count(op) for op in "+-*/") <= 2
        assert gsm8k_score(f"So the answer is\n#### {value}", row["answer"]) == 1.0
        assert gsm8k_score(f"#### {int(value) + 1}", row["answer"]) == 0.0
    assert len({json.dumps(r["prompt"]) for r in rows}) > 290
    held_out = held_out_rows(task, 64, seed=2, num_train=300)
    assert not {json.dumps(r["prompt"]) for r in held_out} & {json.dumps(r["prompt"]) for r in rows}


def test_word_order_rows_and_their_reward():
    from hybridflow.data.tasks import WORD_ORDER_SYSTEM, held_out_rows
    from hybridflow.rewards.word_order import word_order_score

    task = builtin_task("builtin:word_order")
    rows = task_rows(task, 300, seed=2)
    for row in rows:
        system, *example, user = row["prompt"]
        assert system["content"] == WORD_ORDER_SYSTEM and len(example) == 2
        words = user["content"].removeprefix("Words: ").split(", ")
        assert 3 <= len(words) <= 4 and len(set(words)) == len(words)
        ordered = ", ".join(sorted(words))  # independent of the task's own formatting
        assert row["answer"] == ordered
        assert word_order_score(f"Sorted:\n\n{ordered.upper()}.\n", row["answer"]) == 1.0
        assert word_order_score(", ".join(words[::-1]), row["answer"]) == 0.0 or words[::-1] == sorted(words)
        assert word_order_score(", ".join(sorted(words)[:-1]), row["answer"]) == 0.0
        assert word_order_score(f"{ordered}\nDone.", row["answer"]) == 0.0  # only the last line answers
    assert len({json.dumps(r["prompt"]) for r in rows}) == 300
    assert not {json.dumps(r["prompt"]) for r in held_out_rows(task, 64, seed=2, num_train=300)} & {
        json.dumps(r["prompt"]) for r in rows}
