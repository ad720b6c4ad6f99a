"""A safe arithmetic evaluator for the calculator tool: model text is parsed, never run.

The expression is parsed with Python's `ast` module and walked by hand. Only numbers
and the operators + - * / // % ** (binary, and unary + -) are accepted; names, calls,
attributes, subscripts, comparisons, strings and everything else are refused. Size and
time are bounded before any work is done: the text length, the number of syntax
nodes, the nesting depth, the size of every intermediate integer (in bits, checked
*before* a multiplication or a power is computed) and a wall-clock deadline.
Python's ``eval``/``exec`` are never called on the text.
"""
from __future__ import annotations

import ast
import math
import operator
import time

MAX_LENGTH = 200  # characters of expression text
MAX_NODES = 100  # syntax nodes
MAX_DEPTH = 30  # nesting of operations
MAX_BITS = 1024  # any intermediate integer below 2**1024 in magnitude
MAX_EXPONENT = 1024
TIME_LIMIT_S = 0.05

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


def safe_eval(text: str, *, time_limit_s: float = TIME_LIMIT_S) -> int | float:
    """The value of an arithmetic expression such as ``"12*34 - 7"``; CalculatorError otherwise."""
    if not isinstance(text, str):
        raise CalculatorError(f"expression must be text, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise CalculatorError(f"expression too long ({len(text)} characters, at most {MAX_LENGTH})")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError) as err:
        raise CalculatorError(f"not an arithmetic expression: {err.msg if isinstance(err, SyntaxError) else err}")
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CalculatorError(f"expression too large ({nodes} syntax nodes, at most {MAX_NODES})")
    deadline = time.perf_counter() + time_limit_s
    return _eval(tree.body, deadline, 0)


def _eval(node: ast.AST, deadline: float, depth: int) -> int | float:
    if time.perf_counter() > deadline:
        raise CalculatorError("expression took too long")
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression nested too deeply (at most {MAX_DEPTH} levels)")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, not {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, deadline, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _eval(node.left, deadline, depth + 1)
        right = _eval(node.right, deadline, depth + 1)
        _check_cost(node.op, left, right)
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("number too large") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed: only numbers and + - * / // % ** are")


def _bits(value: int | float) -> float:
    if isinstance(value, int):
        return value.bit_length()
    return math.log2(abs(value)) + 1 if value and math.isfinite(value) else 1


def _check_cost(op: ast.operator, left: int | float, right: int | float) -> None:
    """Refuse a multiplication or power whose result would exceed MAX_BITS, before computing it."""
    if isinstance(op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} too large (at most {MAX_EXPONENT} in magnitude)")
        # |left| >= 2**(bits - 1), so |left**right| >= 2**((bits - 1) * right): refused when that lower
        # bound is already too large; below it the result has at most bits * right < MAX_BITS + right
        # <= 2 * MAX_BITS bits, cheap to compute, and _bounded checks the exact size.
        if abs(left) > 1 and (_bits(left) - 1) * max(right, 0) >= MAX_BITS:
            raise CalculatorError(f"power too large (results below 2**{MAX_BITS})")
        if left == 0 and right < 0:
            raise CalculatorError("division by zero")
    elif isinstance(op, ast.Mult) and _bits(left) + _bits(right) > MAX_BITS + 1:
        raise CalculatorError(f"product too large (results below 2**{MAX_BITS})")


def _bounded(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise CalculatorError("complex results are not allowed")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculatorError(f"number too large (at most 2**{MAX_BITS})")
    return value


def format_number(value: int | float) -> str:
    """An int as is; a float with up to 10 significant digits, integral floats without '.0'."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.10g}"
