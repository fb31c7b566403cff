"""The `calculator` tool: arithmetic on numbers with a safe evaluator.

The expression is parsed with `ast` and walked; only number literals, + - * / // % **, unary +/- and
parentheses are allowed (no names, calls, attributes, subscripts, comparisons). Nothing is passed to `eval`.
Work is bounded: the expression's length, exponents, and every intermediate result's size.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from hybridflow.tools.record import ToolRecord

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100  # |value| < 10**MAX_DIGITS for every intermediate result

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model reads."""


def _bounded(value: int | float) -> int | float:
    if abs(value) >= 10**MAX_DIGITS:  # also catches a float overflowing to inf
        raise CalculatorError(f"a result has more than {MAX_DIGITS} digits")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponents are limited to +-{MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    # Check the size before computing it: 99**64 is fine, (10**99)**64 is refused without being built.
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) >= MAX_DIGITS:
        raise CalculatorError(f"a result has more than {MAX_DIGITS} digits")
    value = base**exponent
    if isinstance(value, complex):  # a negative base to a fractional power
        raise CalculatorError("the result is not a real number")
    return value


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # bool is not a number here
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    raise CalculatorError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic `expression`; CalculatorError (for the model to read) when it is not one."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"{expression!r} is not an arithmetic expression") from None
    return _evaluate(tree)


def format_number(value: int | float) -> str:
    """An integer as itself, an integral float without `.0`, other floats to 12 significant digits."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def _calculate(arguments: dict[str, Any]) -> str:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        raise CalculatorError('call it with {"expression": "<arithmetic>"}, for example {"expression": "12 * 7"}')
    return format_number(evaluate_arithmetic(expression))


CALCULATOR = ToolRecord(
    name="calculator",
    description="Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
    parameters={"type": "object",
                "properties": {"expression": {"type": "string", "description": "for example (12 + 7) * 3"}},
                "required": ["expression"]},
    call=_calculate,
    timeout_s=2.0,
)
