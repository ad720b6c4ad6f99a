"""The grading pool: failures cost one reward each, are counted, and never stop the batch."""
import dataclasses
import time

import pytest

from jaxrl_llm.rewards import GraderPool, addition_reward, grade_batch, grade_in_process, math_verify_reward
from tests.rewards import misbehaving_graders as graders

TIMEOUT_S = 1.0


@dataclasses.dataclass
class Gold:
    answer: str
    metadata: dict = dataclasses.field(default_factory=dict)


@pytest.fixture(scope="module")
def pool():
    with GraderPool(2, timeout_s=TIMEOUT_S) as grader_pool:
        yield grader_pool


def blank(n):
    return [Gold("")] * n


def test_raising_grader_scores_zero_and_is_reported(pool):
    result = pool.grade(graders.raises_on_boom, ["right", "boom", "wrong", "right"], blank(4))
    assert result.rewards == (1.0, 0.0, 0.0, 1.0)
    assert result.statuses == ("ok", "error", "ok", "ok")
    assert (result.n_errors, result.n_timeouts) == (1, 0)
    assert result.errors == ("completion 1: ValueError: grader exploded on purpose",)


def test_hung_grader_times_out_within_bounded_time_and_pool_recovers(pool):
    completions = ["right", "hang", "right", "wrong", "right", "right"]
    pool.grade(graders.raises_on_boom, ["right"], blank(1))  # workers up
    pids_before = set(pool.worker_pids)
    start = time.monotonic()
    result = pool.grade(graders.hangs_on_hang, completions, blank(6))
    wall = time.monotonic() - start
    assert result.rewards == (1.0, 0.0, 1.0, 0.0, 1.0, 1.0)
    assert result.statuses[1] == "timeout"
    assert (result.n_errors, result.n_timeouts) == (0, 1)
    assert "completion 1: grader ran past 1 s" in result.errors[0]
    # The deadline held: not before it, and not much after (the grader sleeps an hour).
    assert TIMEOUT_S <= wall < TIMEOUT_S + 10
    # The pool keeps its size, only the hung worker was replaced, and grading goes on.
    pids_after = set(pool.worker_pids)
    assert len(pids_after) == 2 and len(pids_before & pids_after) == 1
    graded_by = pool.grade(graders.worker_pid, ["x"] * 8, blank(8))
    assert set(graded_by.rewards) <= set(map(float, pids_after))
    again = pool.grade(graders.hangs_on_hang, ["right", "wrong"], blank(2))
    assert again.rewards == (1.0, 0.0) and again.n_timeouts == 0


def test_two_hangs_in_one_batch_each_cost_one_timeout(pool):
    result = pool.grade(graders.hangs_on_hang, ["hang", "right", "hang", "right"], blank(4))
    assert result.rewards == (0.0, 1.0, 0.0, 1.0)
    assert result.n_timeouts == 2


def test_worker_that_dies_is_an_error_and_is_replaced(pool):
    result = pool.grade(graders.exits_on_die, ["right", "die", "right"], blank(3))
    assert result.rewards == (1.0, 0.0, 1.0)
    assert result.errors == ("completion 1: grading worker died (exit code 3)",)
    assert pool.grade(graders.exits_on_die, ["right"], blank(1)).rewards == (1.0,)


def test_non_numeric_or_nan_reward_is_an_error(pool):
    result = pool.grade(graders.returns_garbage, ["right", "nan", "text"], blank(3))
    assert result.rewards == (1.0, 0.0, 0.0)
    assert result.n_errors == 2
    assert "non-finite reward nan" in result.errors[0]
    assert "returned str '1.0'" in result.errors[1]


def test_real_grader_in_workers_matches_hand_values(pool):
    # math-verify's import and first parse take over a second on a loaded
    # machine; the warm-up hook keeps that out of the 1 s per-answer deadline.
    completions = ["\\boxed{0.5}", "\\boxed{0.25}", "no box", "\\boxed{\\frac{2}{4}}"]
    result = pool.grade(math_verify_reward, completions, [Gold("\\frac{1}{2}")] * 4)
    assert result.rewards == (1.0, 0.0, 0.0, 1.0)
    assert result.n_errors == result.n_timeouts == 0


def test_trusted_grader_runs_in_process_without_starting_workers():
    with GraderPool(2, timeout_s=TIMEOUT_S) as fresh:
        result = fresh.grade(addition_reward, ["7", "8", "3 + 4 = 7"], [Gold("7")] * 3)
        assert fresh.worker_pids == ()
    assert result.rewards == (1.0, 0.0, 1.0)


def test_in_process_grading_still_counts_errors():
    result = grade_in_process(graders.raises_on_boom, ["boom", "right"], blank(2))
    assert result.rewards == (0.0, 1.0)
    assert result.n_errors == 1


def test_grade_batch_one_shot_pool_and_in_process():
    pooled = grade_batch(graders.raises_on_boom, ["right", "boom"], blank(2), num_workers=1, timeout_s=5)
    local = grade_batch(graders.raises_on_boom, ["right", "boom"], blank(2), num_workers=0, timeout_s=5)
    assert pooled.rewards == local.rewards == (1.0, 0.0)
    assert pooled.n_errors == local.n_errors == 1


def test_bad_arguments_are_named(pool):
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        pool.grade(graders.raises_on_boom, ["a", "b"], blank(1))
    with pytest.raises(TypeError, match="module-level function"):
        pool.grade(lambda completion, example: 1.0, ["a"], blank(1))
    with pytest.raises(ValueError, match="start_method 'fork'"):
        GraderPool(1, 1.0, start_method="fork")
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        GraderPool(1, 0)
    with pytest.raises(ValueError, match="num_workers must be"):
        GraderPool(0, 1.0)


def test_grader_that_cannot_load_fails_the_batch_loudly():
    with GraderPool(1, timeout_s=TIMEOUT_S) as fresh:
        with pytest.raises(RuntimeError, match="could not load the reward function: ImportError"):
            fresh.grade(graders.cannot_load, ["x"], blank(1))
        assert fresh.worker_pids == ()  # closed, not left half-loaded
        assert fresh.grade(graders.raises_on_boom, ["right"], blank(1)).rewards == (1.0,)


def test_empty_batch_starts_nothing():
    with GraderPool(1, timeout_s=TIMEOUT_S) as fresh:
        result = fresh.grade(graders.raises_on_boom, [], [])
        assert fresh.worker_pids == ()
    assert (result.rewards, result.n_errors, result.mean_reward) == ((), 0, 0.0)
