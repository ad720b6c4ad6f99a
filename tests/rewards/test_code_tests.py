"""How a code example's tests are judged in the grader (rewards/code_tests.py): which are compared
calls, what a replayed test asks the program, and its verdict on given plain-data results."""
import pytest

from jaxrl_llm.rewards.code_tests import CompareTest, ReplayTest, parse_test, recorded_calls, replay
from jaxrl_llm.rewards.sandbox_session import Call, CallResult


@pytest.mark.parametrize("source, compare", [
    ("assert f(1, 'a') == [2, (3,)]", CompareTest(Call("f", (1, "a")), [2, (3,)])),
    ("assert f(-1) is None", CompareTest(Call("f", (-1,)), None)),
    ("assert f(2) == 5, 'message'", CompareTest(Call("f", (2,)), 5)),
    ("assert abs(f(1.5) - 2) < 1e-6", None),
    ("assert f(x) == 2", None),            # a name, not a literal
    ("assert g(1) == 2", None),            # not the entry point
    ("assert f(1) is 3", None),            # `is` only with None / True / False
    ("assert f(b'x') == 1", None),         # bytes cannot be sent
    ("assert f(1) == 2\nassert f(2) == 3", None),
])
def test_which_tests_are_compared_calls(source, compare):
    assert parse_test(source, "f") == (compare or ReplayTest(source, "", "f"))


def test_invalid_test_source_is_a_clear_error():
    with pytest.raises(ValueError, match="code test is not valid Python"):
        parse_test("assert f(1) ==", "f")


def values(mapping):
    return {Call("f", args).key(): CallResult(value=value) for args, value in mapping.items()}


LOOP = ReplayTest("for i in range(3):\n    assert f(i) == 2 * i\n", "", "f")


def test_recording_runs_past_failed_asserts():
    assert recorded_calls(LOOP) == (Call("f", (0,)), Call("f", (1,)), Call("f", (2,)))


def test_replay_judges_on_the_given_results():
    assert replay(LOOP, values({(0,): 0, (1,): 2, (2,): 4})) is True
    assert replay(LOOP, values({(0,): 0, (1,): 3, (2,): 4})) is False
    assert replay(LOOP, values({(0,): 0, (1,): 2})) == Call("f", (2,))  # not asked yet


def test_a_failed_call_fails_the_test_even_inside_try():
    test = ReplayTest("try:\n    f(1)\nexcept Exception:\n    pass\n", "", "f")
    raised = {Call("f", (1,)).key(): CallResult(error="raised ValueError: no")}
    assert replay(test, raised) is False


def test_arguments_that_depend_on_results_are_asked_next():
    test = ReplayTest("assert f(f(1)) == 3\n", "", "f")
    assert recorded_calls(test) == (Call("f", (1,)),)  # f(<anything>) is not plain data: skipped
    assert replay(test, values({(1,): 2})) == Call("f", (2,))
    assert replay(test, values({(1,): 2, (2,): 3})) is True


def test_setup_code_and_seeded_random_inputs():
    test = ReplayTest("import random\nassert f(random.randint(0, 10**9)) == helper()\n",
                      "def helper():\n    return 7\n", "f")
    (call,) = recorded_calls(test)
    import random
    expected_arg = random.Random(0).randint(0, 10**9)  # the global random is seeded to 0 before the test
    assert call == Call("f", (expected_arg,))
    assert replay(test, values({(expected_arg,): 7})) is True
