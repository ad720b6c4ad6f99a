"""Which task a config names, and which of its prompts each step and each evaluation sees."""
from __future__ import annotations

from jaxrl_llm.data import HELDOUT, TRAIN, Example, Task
from jaxrl_llm.train.config import Config
from jaxrl_llm.train.config.task import build_task


def task_from_config(cfg: Config) -> Task:
    """The task of cfg.task: a data file when task.data_path / task.jsonl_path is set, else the
    named task with task.kwargs, graded by task.reward_fn when set, played in task.env's
    environment class when that is set (train/config/task.py)."""
    return build_task(cfg.task)


def step_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s prompts and samples: a pure function of (the run's seed, step), so a
    resumed run sees the same prompts and draws the same samples."""
    return seed * 1_000_003 + step


def step_examples(task: Task, step: int, *, seed: int, prompts: int) -> list[Example]:
    """The `prompts` prompts of `step` (the data position) of the run seeded `seed`."""
    return task.examples(TRAIN, prompts, seed=step_seed(seed, step))


def heldout_examples(task: Task, eval_size: int, seed: int) -> list[Example]:
    """The held-out prompts: all of a finite split, or `eval_size` (task.eval_size) distinct ones
    drawn with the run's `seed` (0: all)."""
    if hasattr(task, "all_examples"):
        examples = task.all_examples(HELDOUT)
        return examples[:eval_size] if eval_size else examples
    return task.examples(HELDOUT, eval_size, seed=seed, unique=True)
