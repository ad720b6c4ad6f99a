"""Answer extraction, against hand-written cases."""
import pytest

from jaxrl_llm.rewards import (
    extract_integer_answer,
    extract_last_boxed,
    extract_tagged_answer,
    normalize_math_answer,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{5}", "5"),
        ("so $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),  # two levels
        ("first \\boxed{1}, finally \\boxed{2}", "2"),  # last box wins
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are not grouping
        ("\\boxed{ 12 }", "12"),
        ("\\fbox{7}", "7"),
        ("\\boxed 5", "5"),  # TeX's unbraced argument
        ("\\boxed{12", None),  # truncated
        ("\\boxed{1} and then \\boxed{2", None),  # the final box is truncated
        ("the answer is 5", None),
        ("", None),
    ],
)
def test_extract_last_boxed(text, expected):
    assert extract_last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7", 7),
        ("  7.\n", 7),  # whitespace, trailing period
        ("The answer is 7.", 7),
        ("3 + 4 = 7", 7),  # echoed equation: after the last "="
        ("**12**", 12),
        ("$\\boxed{7}$", 7),
        ("7.0", 7),
        ("1,000", 1000),
        ("-3", -3),
        ("Sure!\n\n7", 7),  # first line holding a digit
        ("7\nBecause 3 + 4 = 7 and 2 + 2 = 4.", 7),  # commentary after the answer line
        ("12 or 13", None),  # a hedge is not an answer
        ("12-13", None),
        ("7, 8", None),
        ("3 + 4 = 7 or 8", None),
        ("7.5", None),  # not an integer
        ("seven", None),
        ("", None),
    ],
)
def test_extract_integer_answer(text, expected):
    assert extract_integer_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer> 42 </answer>", "42"),
        ("<answer>1</answer> no, <answer>2</answer>", "2"),
        ("<answer>\n3*5 + 7\n</answer>", "3*5 + 7"),
        ("<answer>42", None),
        ("42", None),
    ],
)
def test_extract_tagged_answer(text, expected):
    assert extract_tagged_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("$\\dfrac{1}{2}$", "\\frac{1}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\text{Monday}.", "Monday"),
        ("x\\,=\\,3", "x=3"),
        ("X", "X"),  # case is kept
    ],
)
def test_normalize_math_answer(text, expected):
    assert normalize_math_answer(text) == expected
