"""The Task interface: which rewards count as correct (`Task.is_correct`), and where Task lives."""
import numpy as np
import pytest

import jaxrl_llm.data as data
from jaxrl_llm.data import TRAIN, AdditionTask, Example, JsonlTask, Task, make_task, task_names
from jaxrl_llm.data import files, task_base, tasks


class GradedTask(Task):
    """A task with partial credit: 0.5 and up counts as correct."""

    name = "graded"
    reward_fn = staticmethod(lambda text, example: 0.5)
    heldout_fraction = 0.0
    correct_threshold = 0.5

    def examples(self, split, n, *, seed, unique=False):
        self._check_request(split, n)
        return [Example(id=f"g/{i}", task=self.name, prompt="p", answer="a", split=split) for i in range(n)]


def test_is_correct_default_threshold_is_one_on_scalars_and_arrays():
    task = AdditionTask()
    assert task.correct_threshold == 1.0
    for reward, expected in [(1.0, True), (1, True), (0.0, False), (0.999, False), (1.5, True), (-1.0, False),
                             (float("nan"), False), (True, True)]:
        got = task.is_correct(reward)
        assert isinstance(got, np.bool_), reward  # numpy's bool scalar for a scalar reward
        assert bool(got) is expected, reward
    rewards = np.array([[1.0, 0.0, 0.5], [1.0, 1.0, np.nan]], np.float32)
    got = task.is_correct(rewards)
    assert got.dtype == np.bool_ and got.shape == (2, 3)
    np.testing.assert_array_equal(got, [[True, False, False], [True, True, False]])
    np.testing.assert_array_equal(task.is_correct([0.0, 1.0]), [False, True])  # a list works too
    assert task.is_correct(rewards).sum(axis=1).tolist() == [1, 2]  # correct per prompt, as pass@k uses it


def test_subclass_threshold_is_used():
    task = GradedTask()
    np.testing.assert_array_equal(task.is_correct(np.array([0.0, 0.49, 0.5, 1.0])), [False, False, True, True])
    # a float32 reward equal to the threshold is correct even when the threshold is not exact in binary
    task.correct_threshold = 0.3
    assert task.is_correct(np.float32(0.3))
    assert task.is_correct(np.array([0.3], np.float32)).tolist() == [True]
    assert not task.is_correct(np.float32(0.29))
    assert not AdditionTask().is_correct(0.5)  # the instance attribute changed only that task


@pytest.mark.parametrize("name", [n for n in task_names()
                                  # these need arguments (gem and verifiers an env_id: tests/envs)
                                  if n not in ("jsonl", "data_file", "reasoning_gym", "gem", "verifiers")])
def test_registered_tasks_call_their_reference_answer_correct(name):
    task = make_task(name)
    rewards = [task.reward_fn(example.answer, example) for example in task.examples(TRAIN, 2, seed=0)]
    assert task.is_correct(rewards).all()
    assert not task.is_correct(task.reward_fn("not an answer", task.examples(TRAIN, 1, seed=0)[0]))


def test_task_lives_in_task_base_and_is_exported_unchanged():
    # one class, one default, whichever module a caller imports them from
    assert data.Task is tasks.Task is files.Task is task_base.Task
    assert data.DEFAULT_HELDOUT_FRACTION == tasks.DEFAULT_HELDOUT_FRACTION == task_base.DEFAULT_HELDOUT_FRACTION == 0.3
    assert issubclass(JsonlTask, Task) and issubclass(AdditionTask, Task)
    assert tasks.TASK_FACTORIES["jsonl"] is JsonlTask
    with pytest.raises(TypeError):
        Task()  # abstract: examples() is required
