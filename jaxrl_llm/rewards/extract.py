"""Pulling the answer out of a completion.

Each function takes the raw completion text and returns the answer text (or
integer), or None when the completion holds no well-formed answer. None is
graded 0 by every reward in this package; no extractor guesses.
"""
from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")

# One number: optional sign, digits with optional thousands groups, optional
# decimals. "1,000" is one number; "1,2" is two. U+2212 is the typographic minus.
_NUMBER = re.compile(r"[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces nest (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``) and escaped
    braces ``\\{ \\}`` do not count as grouping. ``\\boxed 5`` (TeX's
    unbraced argument) gives ``5``. The last box wins because a solution may
    box intermediate results before the final one. If that last box is not
    closed (a truncated generation) the result is None: an earlier box is
    not the final answer.
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command):]
    if rest.startswith("{"):
        return _braced_group(rest)
    if rest[:1].isspace():
        token = rest.strip().split(maxsplit=1)
        return token[0].rstrip("$") if token else None
    return None  # e.g. "\boxedx": a different command name, not a box


def _braced_group(text: str) -> str | None:
    """Content of the brace group that opens at text[0], or None if unclosed."""
    depth = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # an escaped character never opens or closes a group
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[1:i].strip()
        i += 1
    return None


def extract_tagged_answer(text: str, tag: str = "answer") -> str | None:
    """Stripped content of the last ``<tag>...</tag>`` pair, or None."""
    pattern = re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)
    matches = pattern.findall(text)
    return matches[-1].strip() if matches else None


def extract_integer_answer(text: str) -> int | None:
    """The integer a short-answer completion gives, or None.

    Rule, applied in order:

    1. Look only at the first line that contains a digit (the prompt asks for
       just the number; whatever follows is commentary).
    2. If that line holds "=", keep only what follows the last "=", so an
       echoed equation "3 + 4 = 7" answers 7.
    3. Exactly one number must remain. "7", " 7.", "**7**", "The answer is
       7." and "$\\boxed{7}$" all give 7; "12 or 13", "12-13" and "7, 8"
       hold two numbers and give None (a hedge is not an answer), and so
       does "What is 3 + 4? 7" (an echoed question without "=").
    4. The number must be integral: "7.0" gives 7, "7.5" gives None.
       Thousands separators are accepted: "1,000" gives 1000.
    """
    line = next((ln for ln in text.splitlines() if any(c.isdigit() for c in ln)), None)
    if line is None:
        return None
    line = line.rsplit("=", 1)[-1]
    numbers = _NUMBER.findall(line)
    if len(numbers) != 1:
        return None
    return _integral_value(numbers[0])


def _integral_value(number: str) -> int | None:
    number = number.replace(",", "").replace("\u2212", "-")
    whole, _, fraction = number.partition(".")
    if fraction.strip("0"):
        return None
    return int(whole)


# LaTeX spellings that do not change the value of an answer.
_LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\displaystyle")


def normalize_math_answer(answer: str) -> str:
    """A canonical spelling of a short math answer, for exact string comparison.

    Drops surrounding "$", spacing commands, \\left/\\right, whitespace and a
    trailing period; maps \\dfrac and \\tfrac to \\frac; unwraps \\text{...}.
    Case is kept: "X" and "x" may be different variables.
    """
    text = answer.strip().strip("$").strip()
    for noise in _LATEX_NOISE:
        text = text.replace(noise, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\s+", "", text)
    return text.rstrip(".")


# A fenced block: ``` or ```python / ```py / ```python3 on its own line, up to the next ``` line.
_FENCE = re.compile(r"^```[ \t]*(python3?|py)?[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE | re.IGNORECASE)


def extract_code_block(text: str) -> str | None:
    """The code of the last fenced block (```python, ```py or a bare ```), or None.

    Fences must start their line; a block whose closing fence is missing (a truncated
    generation) is not code, and an earlier block is not the final answer, so the result
    is None then too. This is text processing only: nothing of the completion is run here.
    """
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    tail = text[text.rfind(blocks[-1][1]) + len(blocks[-1][1]):]
    if tail.count("```") > 1:  # another block opened after the last complete one and never closed
        return None
    return blocks[-1][1]
