"""The calculator's safe evaluator fuzzed with hypothesis (issue 35).

`test_fuzzed_text_raises_only_calculator_error` feeds 10,000 generated expressions (deep
nesting, towers of powers, factorial-like products, huge literals, unicode digits, control
characters, long inputs, random operator soup) and asserts that each call either returns a
finite int/float below 2**MAX_BITS or raises CalculatorError -- nothing else escapes --
within a time bound and a bound on the memory it allocates (tracemalloc peak).

`test_small_expressions_match_a_tree_evaluation` checks the values: an expression tree is
generated, printed fully parenthesised, and evaluated a second way -- by walking the tree with
Python's integer arithmetic, not by parsing the text -- and safe_eval must agree: the same
value, or CalculatorError exactly where the reference divides by zero or an intermediate
reaches 2**MAX_BITS. This found that `2 ** 600` was refused as "power too large" (the
pre-check bounded 2**600 by bits(2) * 600 = 1200 bits); see the regression cases below.
"""
from __future__ import annotations

import math
import operator
import time
import tracemalloc
from typing import NamedTuple, Union

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from jaxrl_llm.data.safe_arithmetic import MAX_BITS, MAX_LENGTH, CalculatorError, safe_eval

CALL_TIME_LIMIT_S = 0.5  # the evaluator's own deadline is 0.05 s; parsing 200 characters is far below this
CALL_MEMORY_LIMIT_B = 4 << 20  # peak bytes allocated by one call (a 1024-bit int is ~140 bytes)
FUZZ = settings(max_examples=10_000, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ_FAST = settings(FUZZ, max_examples=1_000)
ORACLE = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])


# ---- text generators -------------------------------------------------------------------------

UNICODE_DIGITS = "٠١٢٣٤٥٦٧٨٩０１２３４５６７８９۳߂३১੪૫୬௭౮೯൦๑໒༣၄႕០᠑²³¹½⅓ⅷ𝟏𝟐"
SOUP = ("0123456789" * 3 + "+-*/%() .e_xjEJ" * 2 + "**//" + UNICODE_DIGITS
        + "\t\n\x00\u200b\u00a0abc'\"[]{},;:=<>!~^&|@#$\\")
ops = st.sampled_from(["+", "-", "*", "/", "//", "%", "**"])
numbers = st.one_of(st.integers(-10**6, 10**6).map(str), st.integers(0, 10**60).map(str),
                    st.floats(allow_nan=False, allow_infinity=False).map(repr),
                    st.sampled_from(["0", "1", "2", "9", "0.5", "1e308", "1e-308", "9" * 150, "0x7f", "1_000",
                                     "1j", "True", "None", "..."]))
spaces = st.sampled_from(["", " ", "  "])


@st.composite
def nested(draw):
    """Parentheses or unary signs n deep around a number (n up to past the parser's own limits)."""
    n = draw(st.integers(0, 120))
    inner = draw(numbers)
    kind = draw(st.sampled_from(["parens", "minus", "mixed"]))
    if kind == "parens":
        return "(" * n + inner + ")" * n
    if kind == "minus":
        return "-" * n + inner
    return "".join(draw(st.sampled_from(["(-", "(+", "-(", "("])) for _ in range(n // 2)) + inner + ")" * n


@st.composite
def towers(draw):
    """a ** b ** c ... (right-associative: the exponent itself is a power) and (a ** b) ** c."""
    bases = ["2", "3", "9", "10", "99", "-2", "0.5", "1.0001", "2.0", "1e10", "999999"]
    parts = draw(st.lists(st.sampled_from(bases), min_size=2, max_size=12))
    if draw(st.booleans()):
        return " ** ".join(parts)
    text = parts[0]
    for p in parts[1:]:
        text = f"({text}) ** {p}"
    return text


@st.composite
def factorials(draw):
    """1 * 2 * ... * n (factorial-like growth), optionally as a power or with a huge factor."""
    n = draw(st.integers(1, 60))
    text = "*".join(str(i) for i in range(1, n + 1))
    return draw(st.sampled_from([text, f"({text}) ** 3", f"{text} * {'9' * 100}", f"({text}) % 7"]))


@st.composite
def long_inputs(draw):
    """Sums and products near and past MAX_LENGTH characters."""
    term = draw(st.sampled_from(["1", "99", "(2**10)", "-3", "7.5"]))
    op = draw(st.sampled_from(["+", "*", "-", "**", "//"]))
    n = draw(st.integers(1, 150))
    return op.join([term] * n)


EDGES = ["2**1023", "(2**1024-1)", "-(2**1023)", "1e308", "1.7976931348623157e308", "-1e308", "5e-324", "2.0**1023",
         "0.5", "0", "0.0", "-0.0", "1", "-1", "3", "1e-308", "(2**1023 + 2**1022)"]


@st.composite
def near_limits(draw):
    """Operations on numbers at the int and float limits (overflowing conversions, inf, underflow)."""
    return f"{draw(st.sampled_from(EDGES))} {draw(ops)} {draw(st.sampled_from(EDGES))}"


@st.composite
def random_expressions(draw):
    """number (op number)* with random parentheses and spacing."""
    n = draw(st.integers(1, 25))
    text = draw(numbers)
    for _ in range(n - 1):
        text = text + draw(spaces) + draw(ops) + draw(spaces) + draw(numbers)
        if draw(st.booleans()):
            text = f"({text})"
    return text


fuzzed_text = st.one_of(st.text(alphabet=SOUP, max_size=2 * MAX_LENGTH), st.text(max_size=MAX_LENGTH + 20),
                        nested(), towers(), factorials(), long_inputs(), near_limits(), random_expressions())


def check_one(text: str) -> None:
    """safe_eval(text): a bounded number or CalculatorError, in bounded time and memory."""
    tracemalloc.start()  # only around the call: tracing hypothesis itself would cost minutes
    start = time.perf_counter()
    try:
        value = safe_eval(text)
    except CalculatorError as err:
        assert str(err), "a CalculatorError says why"
        value = None
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < CALL_TIME_LIMIT_S, (text, elapsed)
    assert peak < CALL_MEMORY_LIMIT_B, (text, peak)
    if value is not None:
        assert type(value) in (int, float), (text, value)
        assert math.isfinite(value) if isinstance(value, float) else value.bit_length() <= MAX_BITS, (text, value)


@pytest.mark.slow
@FUZZ
@given(text=fuzzed_text)
def test_fuzzed_text_raises_only_calculator_error(text):
    check_one(text)


@FUZZ_FAST
@given(text=fuzzed_text)
def test_fuzzed_text_raises_only_calculator_error_fast(text):
    """The same with 1,000 examples, in `make test`."""
    check_one(text)


# ---- values: a second formulation on generated trees ----------------------------------------

class Num(NamedTuple):
    value: int


class Neg(NamedTuple):
    operand: "Tree"


class Bin(NamedTuple):
    op: str
    left: "Tree"
    right: "Tree"


Tree = Union[Num, Neg, Bin]
INT_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


class Refused(Exception):
    """The reference's verdict that safe_eval must raise CalculatorError."""


def trees(max_leaves: int = 10):
    leaf = st.integers(-60, 60).map(Num)
    exponents = st.one_of(st.integers(0, 12), st.integers(0, 1100))

    def extend(children):
        return st.one_of(children.map(Neg),
                         st.tuples(st.sampled_from(sorted(INT_OPS)), children, children).map(lambda t: Bin(*t)),
                         st.tuples(children, exponents).map(lambda t: Bin("**", t[0], Num(t[1]))))
    return st.recursive(leaf, extend, max_leaves=max_leaves)


def render(tree: Tree) -> str:
    """Fully parenthesised, so precedence and associativity come from the tree alone."""
    if isinstance(tree, Num):
        return f"({tree.value})" if tree.value < 0 else str(tree.value)
    if isinstance(tree, Neg):
        return f"-({render(tree.operand)})"
    return f"({render(tree.left)}) {tree.op} ({render(tree.right)})"


def reference(tree: Tree) -> int:
    """The tree's value by Python int arithmetic; Refused where safe_eval must refuse."""
    if isinstance(tree, Num):
        value = tree.value
    elif isinstance(tree, Neg):
        value = -reference(tree.operand)
    else:
        left, right = reference(tree.left), reference(tree.right)
        if tree.op in ("//", "%") and right == 0:
            raise Refused("division by zero")
        if tree.op == "**" and abs(left) > 1 and right * math.log2(abs(left)) > MAX_BITS + 64:
            raise Refused("too large")  # certainly: |left ** right| > 2**(MAX_BITS + 64); not computed
        value = left ** right if tree.op == "**" else INT_OPS[tree.op](left, right)
    if value.bit_length() > MAX_BITS:
        raise Refused("too large")
    return value


def expected(tree: Tree) -> int | None:
    try:
        return reference(tree)
    except Refused:
        return None


@ORACLE
@given(tree=trees())
def test_small_expressions_match_a_tree_evaluation(tree):
    text = render(tree)
    assert len(text) <= MAX_LENGTH  # so only the arithmetic limits apply
    want = expected(tree)
    if want is None:
        with pytest.raises(CalculatorError):
            safe_eval(text, time_limit_s=10.0)
    else:
        got = safe_eval(text, time_limit_s=10.0)
        assert type(got) is int and got == want, (text, got, want)


@ORACLE
@given(num=trees(6), den=trees(6))
def test_true_division_matches_python_int_division(num, den):
    """(a) / (b) of two integer trees: a correctly rounded float, as Python's int / int is."""
    text = f"({render(num)}) / ({render(den)})"
    a, b = expected(num), expected(den)
    try:
        want = a / b if a is not None and b is not None else None
    except (ZeroDivisionError, OverflowError):
        want = None
    if want is None:
        with pytest.raises(CalculatorError):
            safe_eval(text, time_limit_s=10.0)
    else:
        assert safe_eval(text, time_limit_s=10.0) == want, text


@pytest.mark.parametrize("text, value", [
    ("2 ** 600", 2**600),  # regressions: refused as "power too large" before the lower-bound pre-check
    ("3 ** 646", 3**646),  # 1024 bits, the largest power of 3 allowed
    ("2 ** 1023", 2**1023),
    ("(2 ** 1000) ** -1", 2.0**-1000),
    ("1.5 ** 1000", 1.5**1000),
    ("(-2) ** 1023", -(2**1023)),
])
def test_large_but_allowed_powers_are_computed(text, value):
    assert safe_eval(text) == value


@pytest.mark.parametrize("text", ["2 ** 1024", "3 ** 647", "(-2) ** 1025", "1.5 ** 1751", "1e300 ** 4"])
def test_powers_past_the_limit_are_refused(text):
    with pytest.raises(CalculatorError, match="too large"):
        safe_eval(text)
