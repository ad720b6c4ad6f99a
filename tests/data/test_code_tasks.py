"""The code tasks: prompts, tests, splits, and their reference solutions graded in the sandbox."""
import ast
import re

import pytest

from jaxrl_llm.data import FunctionFromExamplesTask, HumanEvalTask, make_task
from jaxrl_llm.rewards import code_reward, grade_in_process
from tests.rewards.sandbox_cases import require_sandbox

# independent formulations of each family, from its parameters
SECOND_FORMULATION = {
    "affine": lambda p, x: p["b"] + sum([p["a"]] * x) if x >= 0 else p["b"] - sum([p["a"]] * -x),
    "square_plus": lambda p, x: x ** 2 + p["c"],
    "mod": lambda p, x: x - p["k"] * (x // p["k"]),
    "repeat": lambda p, s: "".join([s] * p["k"]),
    "count_char": lambda p, s: sum(ch == p["c"] for ch in s),
    "append_reversed": lambda p, s: "".join(reversed(s)) + p["c"],
    "scaled_sum": lambda p, xs: sum(p["k"] * x for x in xs),
    "keep_greater": lambda p, xs: list(filter(lambda v: v > p["t"], xs)),
}


@pytest.fixture(scope="module")
def procedural():
    return make_task("code_from_examples")


def test_prompt_examples_follow_the_hidden_rule(procedural):
    for example in procedural.examples("train", 40, seed=3):
        family, params = example.metadata["family"], example.metadata["params"]
        shown = re.findall(r"^f\((.*)\) == (.*)$", example.prompt, re.MULTILINE)
        assert len(shown) == 4
        for argument, output in shown:
            assert SECOND_FORMULATION[family](params, ast.literal_eval(argument)) == ast.literal_eval(output)
        assert len(example.metadata["tests"]) == 8
        assert example.prompt.endswith("in one ```python code block.")


def test_split_is_by_rule_and_disjoint(procedural):
    train = {e.answer for e in procedural.examples("train", 300, seed=0)}
    heldout = {e.answer for e in procedural.examples("heldout", 100, seed=0)}
    assert train and heldout and not train & heldout
    assert procedural.examples("train", 5, seed=7) == procedural.examples("train", 5, seed=7)


def test_reference_answers_score_one_and_a_constant_scores_by_fraction(procedural):
    require_sandbox()
    examples = procedural.examples("train", 12, seed=1)
    assert grade_in_process(code_reward, [e.answer for e in examples], examples).rewards == (1.0,) * 12
    affine = FunctionFromExamplesTask(families=["affine"], n_shown=1, n_hidden=0)
    example = affine.examples("train", 1, seed=0)[0]
    shown_output = re.search(r"== (.*)$", example.prompt, re.MULTILINE).group(1)
    constant = f"```python\ndef f(x):\n    return {shown_output}\n```"  # right on its one test only
    assert code_reward(constant, example) == 1.0


@pytest.mark.parametrize("kwargs, message", [
    ({"families": ["cubic"]}, "unknown or no function families ['cubic']"),
    ({"n_shown": 0}, "n_shown must be an int in [1, 10]"),
    ({"scoring": "best"}, "scoring 'best' is not valid"),
    ({"sandbox": {"cpu": 1}}, "unknown sandbox limit(s) ['cpu']"),
])
def test_bad_task_config(kwargs, message):
    with pytest.raises(ValueError) as info:
        FunctionFromExamplesTask(**kwargs)
    assert message in str(info.value)


def test_humaneval_problems_and_split():
    task = make_task("humaneval")
    train, heldout = task.all_examples("train"), task.all_examples("heldout")
    assert len(train) + len(heldout) == 164  # HumanEval's size (Chen et al. 2021)
    assert {e.id for e in train}.isdisjoint(e.id for e in heldout)
    assert train[0].id.startswith("humaneval/HumanEval/")
    with pytest.raises(ValueError, match="scoring"):
        HumanEvalTask(scoring="most")


def test_humaneval_canonical_solutions_pass_and_stubs_fail():
    require_sandbox()
    task = make_task("humaneval")
    examples = task.examples("heldout", 6, seed=0, unique=True)
    solutions = [e.answer for e in examples]
    stubs = [f"```python\ndef {e.metadata['entry_point']}(*args):\n    return None\n```" for e in examples]
    result = grade_in_process(code_reward, solutions + stubs, examples + examples)
    assert result.rewards == (1.0,) * 6 + (0.0,) * 6, result.errors


def test_humaneval_tests_are_one_per_assert():
    from jaxrl_llm.data.code_tasks import humaneval_tests, load_humaneval
    problems = load_humaneval()
    counts = [len(humaneval_tests(p)) for p in problems]
    assert sum(c > 1 or p["test"].count("assert") == 1 for c, p in zip(counts, problems)) >= 157
    first = problems[0]  # HumanEval/0: has_close_elements, 7 asserts in its check
    assert first["entry_point"] == "has_close_elements" and counts[0] == 7 == first["test"].count("assert ")


def test_humaneval_fraction_scoring_counts_asserts():
    require_sandbox()
    task = HumanEvalTask(scoring="fraction")
    example = next(e for e in task.all_examples("train") + task.all_examples("heldout")
                   if e.id == "humaneval/HumanEval/0")
    # always False: right exactly on the asserts that expect False (3 of 7 in HumanEval/0)
    always_false = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    expected_false = sum("== False" in t or "assert not" in t for t in example.metadata["tests"])
    assert code_reward(always_false, example) == pytest.approx(expected_false / 7) and expected_false == 3
