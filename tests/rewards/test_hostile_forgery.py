"""Score forgery (issue 61, class 1): wrong programs that try to raise their own reward, graded
through the training loop's path (GraderPool, code_reward, default SandboxLimits, a real
code_from_examples question and real HumanEval problems) in one batch beside honest answers.

Each program gets exactly the reward it deserves (forgery_cases.py: 0, or the shown examples'
0.5 for the lookup table), the status it deserves, and is counted in n_forgery_suspected when
its trick shows in what comes back (a result that is not plain data, bytes on the result
channel that the runner never writes). How each defence was broken on purpose, and which of
these cases then failed: docs/architecture.md, "Code execution sandbox".
"""
import random

import pytest

from jaxrl_llm.data.code_tasks import FunctionFromExamplesTask, HumanEvalTask
from jaxrl_llm.rewards import GraderPool, code_reward, grade_in_process
from tests.rewards.forgery_cases import class_1
from tests.rewards.sandbox_cases import CodeExample, fenced, require_sandbox

HONEST = "def f(x):\n    return x - 5\n"
JOB_SPY = "import os\ndef f(x):\n    return sorted(os.listdir('/job'))\n"
# HumanEval/2 truncate_number: `candidate(3.5) == 0.5` is compared, `abs(candidate(1.33) - 0.33) < 1e-6` replayed
NUMBER_LIKE = ("class Zero(float):\n"
               "    def __eq__(self, other):\n        return True\n"
               "    def __sub__(self, other):\n        return Zero()\n"
               "    def __abs__(self):\n        return 0.0\n"
               "    def __lt__(self, other):\n        return True\n"
               "    __hash__ = float.__hash__\n"
               "def truncate_number(number):\n    return Zero(7.0)\n")


def affine_example():
    """The question f(x) = x - 5: 4 shown examples (f(5) == 0, f(-17) == -22, f(-16) == -21,
    f(14) == 9) and 4 hidden, each `assert f(x) == y`; default sandbox limits."""
    example = FunctionFromExamplesTask(families=["affine"]).example("affine", random.Random(7))
    assert example.metadata["params"] == {"a": 1, "b": -5} and example.metadata["sandbox"] == {}
    return example


def humaneval(number: int):
    return next(e for e in HumanEvalTask(scoring="fraction")._examples if e.id == f"humaneval/HumanEval/{number}")


@pytest.fixture(scope="module")
def graded():
    require_sandbox()
    affine, truncate = affine_example(), humaneval(2)
    job_spy_example = CodeExample(answer="", metadata={
        # scratch: the mountpoint of its own /tmp and /dev/shm (sandbox_walls.SCRATCH)
        "tests": ["assert f(0) == ['plain_data.py', 'program.py', 'runner.py', 'scratch']"], "sandbox": {}})
    cases = [(fenced(case.program), affine) for case in class_1]
    cases += [(fenced(HONEST), affine), (fenced(JOB_SPY), job_spy_example), (fenced(NUMBER_LIKE), truncate),
              (truncate.answer, truncate)]
    with GraderPool(1, timeout_s=60) as pool:
        result = pool.grade(code_reward, [text for text, _ in cases], [example for _, example in cases])
    return result


def _suspected(result, index: int) -> bool:
    return any(message.startswith(f"completion {index}:") for message in result.suspicions)


@pytest.mark.parametrize("index", range(len(class_1)), ids=[case.name for case in class_1])
def test_a_forger_gets_what_it_deserves(graded, index):
    case = class_1[index]
    assert (graded.rewards[index], graded.statuses[index]) == (case.reward, case.status), (graded.errors, graded.suspicions)
    assert _suspected(graded, index) == case.suspected, graded.suspicions


def test_the_forgery_metric_counts_the_suspected_ones(graded):
    assert len(class_1) >= 13
    suspected = sum(case.suspected for case in class_1)
    assert suspected == 9 and graded.n_forgery_suspected == suspected + 1  # + the HumanEval/2 forger below


def test_honest_answers_in_the_same_batch_score_in_full(graded):
    n = len(class_1)
    # the honest f; the job folder holds no test (the spy's own listing); a float-subclass forger
    # on HumanEval/2 scores 0 and is counted; the canonical solution of HumanEval/2 scores 1
    assert graded.rewards[n:] == (1.0, 1.0, 0.0, 1.0), (graded.errors, graded.suspicions)
    assert [_suspected(graded, i) for i in range(n, n + 4)] == [False, False, True, False]


def reward_125(completion, example):
    """A grader gone wrong: 125, as the old report parsing gave for 1000 PASS lines on 8 tests."""
    return 125.0 if completion == "high" else -3.0


reward_125.reward_range = (0.0, 1.0)


def test_rewards_outside_the_grader_s_range_are_clipped_and_counted():
    for result in (grade_in_process(reward_125, ["high", "low"], [None, None]),
                   GraderPool(1, timeout_s=20).grade(reward_125, ["high", "low"], [None, None])):
        assert result.rewards == (1.0, 0.0) and result.statuses == ("ok", "ok")
        assert result.n_forgery_suspected == 2 and "reward 125 outside the grader's range [0, 1]" in result.suspicions[0]


def test_code_reward_declares_its_range():
    assert code_reward.reward_range == (0.0, 1.0)


def test_honest_results_of_plain_subclasses_travel_by_value():
    """A Counter, a namedtuple and an IntEnum are judged as the dict, tuple and int they hold
    (read by the base type's own methods); a generator is not plain data and fails, uncounted."""
    require_sandbox()
    tests = ["assert f('abca') == {'a': 2, 'b': 1, 'c': 1}", "assert f(1) == (1, 2)", "assert f(2) == 3"]
    example = CodeExample(answer="", metadata={"tests": tests, "sandbox": {}})
    programs = {
        "from collections import Counter, namedtuple\nimport enum\nPair = namedtuple('Pair', 'a b')\n"
        "Three = enum.IntEnum('Three', {'THREE': 3})\n"
        "def f(x):\n    return Counter(x) if isinstance(x, str) else Pair(1, 2) if x == 1 else Three.THREE\n": 1.0,
        "def f(x):\n    return (c for c in 'not plain')\n": 0.0,
    }
    result = grade_in_process(code_reward, [fenced(p) for p in programs], [example] * len(programs))
    assert result.rewards == tuple(programs.values()) and result.n_forgery_suspected == 0, result
