"""The calculator evaluates arithmetic with an `ast` walk and refuses everything else, bounded in work."""

from __future__ import annotations

import operator

import pytest

from hybridflow.tools.calculator import CALCULATOR, CalculatorError, evaluate_arithmetic, format_number


@pytest.mark.parametrize("expression, reference", [
    ("37 * 24", 37 * 24), ("(12 + 7) * 3", (12 + 7) * 3), ("-5 + +2", -3), ("7 // 2", 3), ("7 % 4", 3),
    ("2 ** 10", 1024), ("2 ** -2", 0.25), ("1.5 * 4", 6.0), ("100 / 8", 12.5), ("-(3 - 10) * 2", 14),
])
def test_arithmetic_matches_python(expression, reference):
    assert evaluate_arithmetic(expression) == reference


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('true')", "not Call"), ("x + 1", "not Name"), ("(1).real", "not Attribute"),
    ("[1][0]", "not Subscript"), ("1 < 2", "not Compare"), ("True + 1", "not Constant"), ("'a' * 3", "not Constant"),
    ("1 / 0", "division by zero"), ("5 % 0", "division by zero"), ("0 ** -1", "division by zero"),
    ("2 ** 65", "exponents are limited"), ("10 ** 64 * 10 ** 64", "more than 100 digits"),
    ("(10 ** 50) ** 3", "more than 100 digits"), ("(-8) ** 0.5", "not a real number"),
    ("1 +", "not an arithmetic expression"), ("1" * 201, "longer than 200"), ("1e99 * 1e99", "more than 100 digits"),
])
def test_refused_expressions(expression, message):
    with pytest.raises(CalculatorError, match=message):
        evaluate_arithmetic(expression)


def test_tool_call_formats_numbers():
    assert CALCULATOR.call({"expression": "84 / 2"}) == "42"
    assert CALCULATOR.call({"expression": "1 / 3"}) == format(operator.truediv(1, 3), ".12g")
    assert format_number(2**40) == "1099511627776"
    with pytest.raises(CalculatorError, match='"expression"'):
        CALCULATOR.call({"expr": "1"})
