"""The bundled `calculator` tool (`objective.tools=[align.rewards.calculator:calculator]`): arithmetic on
numbers, evaluated by walking the expression's `ast`, never by `eval`. Accepted: integer and decimal
literals, + - * / // % ** and unary + -, and parentheses; anything else (names, calls, attributes,
strings, comparisons) is refused with a message the model gets back as the tool's result. Exponents
and results are bounded so that one call cannot hang the rollout or fill the memory."""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

MAX_CHARS = 200
"""Longest expression read (a longer one is refused unread)."""
MAX_EXPONENT = 64
"""Largest |exponent| of `**`: 2 ** 64 is fine, 9 ** 9 ** 9 is not computed."""
MAX_DIGITS = 60
"""Largest integer result, in decimal digits, before it is refused."""

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """An expression the calculator does not evaluate; its message is the tool's result."""


def _check(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    if isinstance(value, int) and abs(value) >= 10 ** MAX_DIGITS:
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    return value


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is beyond +-{MAX_EXPONENT}")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
    raise CalculatorError(f"{type(node).__name__} is not arithmetic; accepted: numbers, + - * / // % ** and "
                          "parentheses")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; CalculatorError for anything that is not one."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r} as arithmetic") from None
    return _eval(tree)


def calculator(expression: str) -> str:
    """Tool: the value of `expression` as text (an integral float without its `.0`)."""
    value = evaluate(expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        value = int(value)
    return str(value)
