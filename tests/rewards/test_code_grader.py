"""The code grader on honest programs: extraction, scoring, limits config, the pool's counting."""
import pytest

from jaxrl_llm.rewards import (BUILTIN_GRADERS, CodeRunError, GraderPool, GraderTimeout, SandboxLimits,
                               code_reward, extract_code_block, grade_in_process)
from tests.rewards.sandbox_cases import example, fenced, require_sandbox

ADD_TESTS = ["assert f(1) == 2", "assert f(2) == 3", "assert f(10) == 11", "assert f(-1) == 0"]


@pytest.fixture(scope="module", autouse=True)
def sandbox_works():
    require_sandbox()


@pytest.mark.parametrize("text, code", [
    ("```python\nx = 1\n```", "x = 1\n"),
    ("```py\nx = 1\n```", "x = 1\n"),
    ("```\nx = 1\n```", "x = 1\n"),
    ("first\n```python\nx = 1\n```\nthen\n```python\ny = 2\n```\n", "y = 2\n"),  # the last block wins
    ("no code here", None),
    ("```python\nx = 1\n", None),  # never closed
    ("```python\nx = 1\n```\n```python\ny = 2\n", None),  # the final block is truncated
    ("inline ```x = 1``` is not a block", None),
])
def test_extract_code_block(text, code):
    assert extract_code_block(text) == code


def test_fraction_counts_passed_tests():
    wrong_on_negative = "def f(x):\n    return abs(x) + 1"
    assert code_reward(fenced(wrong_on_negative), example(ADD_TESTS)) == 0.75  # 3 of 4 by hand


def test_all_or_nothing():
    assert code_reward(fenced("def f(x):\n    return abs(x) + 1"), example(ADD_TESTS, scoring="all")) == 0.0
    assert code_reward(fenced("def f(x):\n    return x + 1"), example(ADD_TESTS, scoring="all")) == 1.0


def test_no_code_block_scores_zero_without_running():
    assert code_reward("def f(x):\n    return x + 1", example(ADD_TESTS)) == 0.0


def test_program_that_raises_fails_every_test():
    assert code_reward(fenced("raise SystemExit(0)\ndef f(x):\n    return x + 1"), example(ADD_TESTS)) == 0.0


def test_own_temporary_directory_is_writable():
    program = "open('scratch.txt', 'w').write('ok')\ndef f():\n    return open('/tmp/scratch.txt').read()"
    assert code_reward(fenced(program), example(["assert f() == 'ok'"])) == 1.0




@pytest.mark.parametrize("metadata, message", [
    ({"tests": ["assert 1"], "scoring": "most"}, "scoring 'most' is not valid"),
    ({"tests": []}, "non-empty list of strings"),
    ({"tests": ["assert 1"], "sandbox": {"wall_seconds": 1}}, "unknown sandbox limit(s) ['wall_seconds']"),
    ({"tests": ["assert 1"], "sandbox": {"memory_mb": -5}}, "memory_mb must be a positive finite number"),
    ({"tests": ["assert 1"], "sandbox": {"max_processes": 2.5}}, "max_processes must be an int"),
    ({"tests": ["assert 1"], "sandbox": [1, 2]}, "sandbox limits must be a mapping"),
])
def test_bad_config_is_a_clear_error(metadata, message):
    ex = example()
    ex.metadata = metadata
    with pytest.raises(ValueError) as info:
        code_reward(fenced("x = 1"), ex)
    assert message in str(info.value)


def test_sandbox_limits_reject_too_few_processes():
    with pytest.raises(ValueError, match="max_processes must be >= 4"):
        SandboxLimits(max_processes=2)


def test_registered_as_builtin_grader():
    assert BUILTIN_GRADERS["code"] is code_reward


def test_timeouts_and_errors_are_counted_like_other_graders():
    completions = [fenced("def f(x):\n    return x + 1"), fenced("import time\ntime.sleep(30)"),
                   fenced("import os\nos._exit(0)")]
    examples = [example(ADD_TESTS, wall_s=3.0)] * 3
    for result in (grade_in_process(code_reward, completions, examples),
                   GraderPool(1, timeout_s=20).grade(code_reward, completions, examples)):
        assert result.rewards == (1.0, 0.0, 0.0), result
        assert result.statuses == ("ok", "timeout", "error")
        assert (result.n_errors, result.n_timeouts) == (1, 1)
        assert "wall-clock limit" in result.errors[0] and "after answering 0 of 4 calls" in result.errors[1]


def test_exception_types():
    assert issubclass(GraderTimeout, Exception) and issubclass(CodeRunError, RuntimeError)


def test_sandbox_tool_names_bubblewrap_without_running_it():
    from jaxrl_llm.rewards import sandbox_tool
    tool = sandbox_tool()
    assert tool["tool"] == "bubblewrap" and tool["path"].endswith("bwrap") and tool["python"].startswith("/usr/")


def test_throughput_benchmark_at_tiny_size():
    from jaxrl_llm.benchmarks.cpu import code_sandbox
    out = code_sandbox.measure(workers=1, batch=3, repeats=1)  # raises unless every reference passes
    assert out["batch"] == 3 and len(out["executions_per_s"]) == 1 and out["median_executions_per_s"] > 0



def test_a_broken_sandbox_stops_the_batch(monkeypatch):
    from jaxrl_llm.rewards import sandbox, sandbox_session
    from tests.rewards.sandbox_cases import code_reward_on_a_broken_sandbox
    monkeypatch.setattr(sandbox, "sandbox_python", lambda: "/usr/bin/no-such-python")
    with pytest.raises(sandbox.SandboxUnavailable, match="could not run a trivial program"):
        sandbox_session.probe_sandbox()
    # in a worker: its warm-up probe fails, and the batch raises instead of scoring 0
    with pytest.raises(RuntimeError, match="could not load the reward function: SandboxUnavailable"):
        GraderPool(1, timeout_s=20).grade(code_reward_on_a_broken_sandbox, [fenced("x = 1")], [example()])
