"""Reward functions on hand-written completions; expected rewards derived by hand."""
import dataclasses

import pytest

from jaxrl_llm.rewards import (
    addition_reward,
    math_answers_equal,
    math_verify_reward,
    reasoning_gym_answer_text,
    reasoning_gym_reward,
)


@dataclasses.dataclass
class Gold:
    """The two attributes a grader reads; rewards do not depend on jaxrl_llm.data."""

    answer: str
    metadata: dict = dataclasses.field(default_factory=dict)


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("7", "7", 1.0),
        (" 7.", "7", 1.0),
        ("The answer is 7.", "7", 1.0),
        ("3 + 4 = 7", "7", 1.0),
        ("8", "7", 0.0),
        ("7 or 8", "7", 0.0),
        ("seven", "7", 0.0),
        ("17", "7", 0.0),
        ("", "0", 0.0),
        ("0", "0", 1.0),
        ("1,998", "1998", 1.0),
    ],
)
def test_addition_reward(completion, answer, expected):
    assert addition_reward(completion, Gold(answer)) == expected


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", 1.0),
        ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", 1.0),  # sets are unordered
        ("\\boxed{9\\pi}", "9\\pi", 1.0),
        ("\\boxed{28.27}", "9\\pi", 0.0),  # 9 pi = 28.2743..., rounding is not equality
        ("\\boxed{\\text{Monday}}", "\\text{Monday}", 1.0),
        ("\\boxed{5}", "6", 0.0),
        ("first \\boxed{2}, then \\boxed{3}", "3", 1.0),  # last box wins
        ("first \\boxed{2}, then \\boxed{3}", "2", 0.0),
        ("The answer is 0.5", "0.5", 0.0),  # no box, no answer
        ("\\boxed{0.5", "0.5", 0.0),  # truncated box
        # gold given as a full MATH solution: its last box is the gold
        ("\\boxed{7}", "Sum of roots $= \\boxed{7}$.", 1.0),
        ("\\boxed{8}", "Sum of roots $= \\boxed{7}$.", 0.0),
    ],
)
def test_math_verify_reward(completion, gold, expected):
    assert math_verify_reward(completion, Gold(gold)) == expected


def test_math_answers_equal_falls_back_to_strings_math_verify_cannot_parse():
    # math-verify parses neither; the normalised spellings match.
    assert math_answers_equal("\\text{(B) blue}", "\\text{(B) blue}.")
    assert not math_answers_equal("\\text{(B) blue}", "\\text{(C) red}")


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("thinking...<answer> 3*5+7 </answer>", "3*5+7"),
        ("so \\boxed{22}", "22"),
        ("  22\n", "22"),
    ],
)
def test_reasoning_gym_answer_text(completion, expected):
    assert reasoning_gym_answer_text(completion) == expected


# Countdown: reach 22 from 3, 5, 7. reasoning-gym's verifier scores 1.0 for any
# expression that uses exactly these numbers and equals the target, 0.05 for a
# parseable expression that misses, 0.01 for text it cannot parse.
COUNTDOWN = Gold(
    answer="3*5 + 7",
    metadata={
        "rg_dataset": "countdown",
        "rg_config": {},
        "rg_question": "Calculate 22 using all of these numbers: 3, 5, 7.",
        "rg_metadata": {"numbers": [3, 5, 7], "target": 22},
    },
)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>3*5 + 7</answer>", 1.0),
        ("<answer>7 + 5*3</answer>", 1.0),  # another correct expression, not the reference string
        ("7 + 3*5", 1.0),  # untagged answer: the whole completion
        ("<answer>3 + 5 + 7</answer>", 0.05),  # = 15
        ("<answer>3*5 + 8</answer>", 0.05),  # wrong numbers
        ("<answer>I cannot</answer>", 0.01),
    ],
)
def test_reasoning_gym_reward_countdown(completion, expected):
    assert reasoning_gym_reward(completion, COUNTDOWN) == pytest.approx(expected)


def test_reasoning_gym_reward_names_missing_metadata():
    with pytest.raises(KeyError, match=r"lacks metadata \['rg_dataset', 'rg_config'"):
        reasoning_gym_reward("1", Gold("1", metadata={"rg_question": "q", "rg_metadata": {}}))
