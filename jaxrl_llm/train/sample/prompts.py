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


def step_seed(cfg: Config, step: int) -> int:
    """The seed of step `step`'s prompts and samples: a pure function of (seed, step), so a
    resumed run sees the same prompts and draws the same samples."""
    return cfg.seed * 1_000_003 + step


def step_examples(task: Task, cfg: Config, step: int) -> list[Example]:
    """The prompts of `step` (the data position)."""
    return task.examples(TRAIN, cfg.rollout.prompts_per_step, seed=step_seed(cfg, step))


def heldout_examples(task: Task, cfg: Config) -> list[Example]:
    """The held-out prompts: all of a finite split, or task.eval_size distinct ones (0: all)."""
    if hasattr(task, "all_examples"):
        examples = task.all_examples(HELDOUT)
        return examples[:cfg.task.eval_size] if cfg.task.eval_size else examples
    return task.examples(HELDOUT, cfg.task.eval_size, seed=cfg.seed, unique=True)
