"""HumanEval through the code grader (jaxrl_llm/benchmarks/cpu/humaneval_grading.py): canonical
solutions score 1, the stub returning None and another problem's solution score 0. A subset of
each test category here; all 164 in the slow test (stored: benchmarks/results/humaneval-grading-*.json)."""
import pytest

from jaxrl_llm.benchmarks.cpu.humaneval_grading import measure
from jaxrl_llm.data.code_tasks import humaneval_setup, humaneval_tests, load_humaneval
from tests.rewards.sandbox_cases import require_sandbox

# compared calls only (0, 12); some asserts replayed (2: abs(...) < 1e-6; 33: tuple(...) == tuple(...));
# the whole check replayed (32: find_zero over 100 seeded random polynomials; 38: encode_cyclic from the prompt)
SUBSET = ["HumanEval/0", "HumanEval/2", "HumanEval/12", "HumanEval/32", "HumanEval/33", "HumanEval/38"]


def test_the_conversion_rule_on_humaneval_2():
    problem = load_humaneval()[2]  # check: `candidate(3.5) == 0.5`, then two `abs(candidate(..) - ..) < 1e-6`
    tests = humaneval_tests(problem)
    assert tests[0] == "assert truncate_number(3.5) == 0.5"
    assert tests[1] == ("def check(candidate):\n    assert abs(candidate(1.33) - 0.33) < 1e-6\n\n"
                        "check(truncate_number)\n")
    assert humaneval_setup(problem).startswith(problem["prompt"]) and "METADATA" in humaneval_setup(problem)


def test_a_subset_of_every_category():
    require_sandbox()
    out = measure(workers=1, problem_ids=SUBSET)
    assert out["rewards"] == {"canonical": {"1.0": 6}, "return_none": {"0.0": 6}, "next_problem_s_solution": {"0.0": 6}}
    assert out["category_counts"] == {"compared_calls_only": 2, "some_asserts_replayed": 2, "whole_check_replayed": 2}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_all_164_problems():
    require_sandbox()
    out = measure(workers=1)
    assert out["rewards"] == {"canonical": {"1.0": 164}, "return_none": {"0.0": 164},
                              "next_problem_s_solution": {"0.0": 164}}, out["not_as_expected"]
    # 7 checks are not assert-only (the task's docstring: 157 of 164 are)
    assert out["category_counts"]["whole_check_replayed"] == 7 and sum(out["category_counts"].values()) == 164
