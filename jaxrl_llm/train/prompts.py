"""Which task a config names, and which of its prompts each step and each evaluation sees."""
from __future__ import annotations

from jaxrl_llm.data import HELDOUT, TRAIN, Example, Task, make_task
from jaxrl_llm.data.environments import PluginEnvTask, parse_env_kwargs
from jaxrl_llm.data.plugins import PluginError, load_object
from jaxrl_llm.train.config import ENV_TASK_NAMES, Config, ConfigError


def task_from_config(cfg: Config) -> Task:
    """The task of cfg.task: a JSONL file when task.jsonl_path is set, else the named task;
    its examples played in the user's environment class when task.env is set."""
    task = _named_task(cfg)
    if cfg.task.env:
        try:
            env_class = load_object(cfg.task.env, what="task.env")
        except PluginError as err:
            raise ConfigError(str(err)) from None
        if not callable(env_class):
            raise ConfigError(f"task.env = {cfg.task.env!r} names {type(env_class).__name__} {env_class!r:.60}; "
                              "valid: a class (or factory) of environments")
        return PluginEnvTask(task, env_class, parse_env_kwargs(cfg.task.env_kwargs))
    return task


def _named_task(cfg: Config) -> Task:
    if cfg.task.name in ENV_TASK_NAMES and not cfg.task.env:  # task.env_kwargs configure the built-in env task
        kwargs = parse_env_kwargs(cfg.task.env_kwargs)
        try:
            return make_task(cfg.task.name, **kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"task.env_kwargs = {cfg.task.env_kwargs!r} for task {cfg.task.name!r}: {err}") from None
    if cfg.task.jsonl_path:
        return make_task("jsonl", path=cfg.task.jsonl_path)
    if cfg.task.name == "jsonl":
        raise ConfigError("task.name = 'jsonl' needs task.jsonl_path; valid: task.jsonl_path=FILE (a JSONL file "
                          "of prompt/answer lines)")
    if cfg.task.name == "addition":
        return make_task("addition", digits=cfg.task.digits)
    return make_task(cfg.task.name)


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
