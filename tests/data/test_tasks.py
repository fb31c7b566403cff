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
