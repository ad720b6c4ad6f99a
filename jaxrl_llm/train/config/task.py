"""The task a config's `task` section names, with the user's own parts plugged in.

Everything a researcher brings is named in the config, so nothing in the library is edited:

  task.plugins    modules imported first; they register tasks with `@register_task("name")`
                  (jaxrl_llm.data.register_task), so `task.name` can name them.
  task.kwargs     a JSON object of keyword arguments for the task's factory, checked against its
                  signature: `task.name=reasoning_gym task.kwargs='{"dataset": "maze"}'`.
  task.reward_fn  the grader, replacing the task's own: "exact", "math_verify", "addition",
                  "reasoning_gym", or a user function "package.module:function" with the
                  signature `fn(completion: str, example: jaxrl_llm.data.Example) -> float`
                  (`example.answer` is the reference text, `example.metadata` the data set's
                  other fields). It runs in the grader worker processes under
                  task.reward_timeout_s; a call that raises, hangs or returns a non-finite or
                  non-number value scores 0 and is counted in reward_errors / reward_timeouts.
  task.reward_fns several graders named as reward_fn is, with task.reward_weights (1 each when
                  empty): the reward is their weighted sum, each one is logged (reward_<name>) and
                  the GDPO advantage normalises each within its group (`task_graders`).
  task.data_path  a local JSON/JSONL/Parquet/CSV file read with HF datasets (data/files.py),
                  its question and answer in the columns task.prompt_field / task.answer_field.
  task.env        an environment class "package.module:Class" in which the task's examples are
                  played as multi-turn episodes (data/environments.py), built with task.env_kwargs.
  task.judge      an LLM judge (train/config/judge.py, rewards/judge.py): with task.judge.model set it
                  is the reward, or, named "judge" in task.reward_fns, one weighted part of it.

Every name is checked when the config is built (`check_task_section`), so a typo fails before
any model loads, with a ConfigError naming the field. Data files are opened only when the task
is built (the loop does that before loading the model): a config may be written on a machine
that does not hold them.
"""
from __future__ import annotations

import inspect
import pickle
from typing import Any

from jaxrl_llm.data import (DatasetFormatError, EnvTask, Task, check_task_kwargs, import_task_plugins, make_task,
                            task_names)
from jaxrl_llm.data.environments import PluginEnvTask
from jaxrl_llm.data.registry import TASK_FACTORIES
from jaxrl_llm.data.files import data_file_format
from jaxrl_llm.data.plugins import PluginError, load_object
from jaxrl_llm.data.code_tasks import CODE_TASKS
from jaxrl_llm.rewards import BUILTIN_GRADERS, JudgeReward, RewardFn, SandboxLimits, ScoreFormat, WeightedRewards
from jaxrl_llm.utils.typed_config import ConfigError, did_you_mean


# Tasks read from a file, and the field naming it.
FILE_TASKS = {"jsonl": "jsonl_path", "data_file": "data_path"}
JUDGE = "judge"  # the grader name of task.judge in task.reward_fn / task.reward_fns


def _load_callable(spec: str, field: str, valid: str) -> Any:
    """The callable `spec` = "package.module:name" names; ConfigError naming `field` otherwise."""
    try:
        target = load_object(spec, what=field)
    except PluginError as err:
        raise ConfigError(str(err)) from None
    if not callable(target):
        raise ConfigError(f"{field} = {spec!r} names {type(target).__name__} {target!r:.60}, not a function or class; "
                          f"valid: {valid}")
    return target


def resolve_reward_fn(spec: str, field: str = "task.reward_fn") -> RewardFn:
    """The grader `spec` names: a built-in grader or a user "package.module:function".

    A user function must take (completion, example) and travel to a worker process by
    reference (pickle), so it has to be a module-level function of an importable module.
    """
    if spec in BUILTIN_GRADERS:
        return BUILTIN_GRADERS[spec]
    if ":" not in spec:
        raise ConfigError(f"{field} = {spec!r} is invalid; valid: one of {', '.join(BUILTIN_GRADERS)} or "
                          f"'package.module:function'{did_you_mean(spec, list(BUILTIN_GRADERS))}")
    fn = _load_callable(spec, field, "fn(completion: str, example) -> float")
    try:
        inspect.signature(fn).bind("completion", None)
    except TypeError as err:
        raise ConfigError(f"{field} = {spec!r} cannot be called as fn(completion, example) ({err}); "
                          "valid: fn(completion: str, example) -> float") from None
    except ValueError:  # builtins without a signature: let the workers find out
        pass
    try:
        pickle.loads(pickle.dumps(fn))
    except Exception as err:
        raise ConfigError(f"{field} = {spec!r} cannot be sent to a grader worker ({err}); "
                          "valid: a module-level function, not a lambda or a nested function") from None
    return fn


def make_judge(task_cfg) -> JudgeReward:
    """The (unconnected) judge reward of task.judge; train/sample/judge.py connects it to its server."""
    judge = task_cfg.judge
    return JudgeReward(judge.rubric, ScoreFormat.parse(judge.score_format), cache_size=judge.cache_size)


def task_grader(task_cfg, spec: str, field: str) -> RewardFn:
    """The grader `spec` names in `field` of the task section: "judge" (task.judge's), or as resolve_reward_fn."""
    if spec != JUDGE:
        return resolve_reward_fn(spec, field)
    if not task_cfg.judge.enabled:
        raise ConfigError(f"{field} names {JUDGE!r} but task.judge.model is not set; valid: task.judge.model="
                          "smollm2 or a judge model directory, or another grader")
    return make_judge(task_cfg)


def check_judge_use(task_cfg) -> None:
    """With task.judge.model set, task.reward_fn / task.reward_fns either name "judge" or are unset."""
    if not task_cfg.judge.enabled:
        return
    if is_env_task(task_cfg):
        raise ConfigError(f"task.judge.model = {task_cfg.judge.model!r} with an environment task (task.name = "
                          f"{task_cfg.name!r}, task.env = {task_cfg.env!r}): the environment's step rewards are the "
                          "rewards; valid: leave task.judge.model unset")
    named = [task_cfg.reward_fn] if task_cfg.reward_fn is not None else list(task_cfg.reward_fns)
    if named and JUDGE not in named:
        raise ConfigError(f"task.judge.model = {task_cfg.judge.model!r}, but the graders named ({named}) do not "
                          f"include {JUDGE!r}; valid: add {JUDGE!r} to task.reward_fns (weighted with the others), "
                          "or unset task.reward_fn/reward_fns (the judge alone)")


def task_arguments(task_cfg) -> tuple[str, dict[str, Any]]:
    """(registered task name, keyword arguments) that `task_cfg` builds: its own fields
    (the file and its columns, addition's digits) plus task.kwargs."""
    if task_cfg.jsonl_path and task_cfg.data_path:
        raise ConfigError(f"task.jsonl_path = {task_cfg.jsonl_path!r} and task.data_path = {task_cfg.data_path!r} "
                          "are both set; valid: one of them (task.data_path reads .jsonl files too)")
    if task_cfg.data_path:
        name, own = "data_file", {"path": ("data_path", task_cfg.data_path),
                                  "prompt_field": ("prompt_field", task_cfg.prompt_field),
                                  "answer_field": ("answer_field", task_cfg.answer_field)}
    elif task_cfg.jsonl_path:
        name, own = "jsonl", {"path": ("jsonl_path", task_cfg.jsonl_path)}
    elif task_cfg.name in FILE_TASKS:
        field = FILE_TASKS[task_cfg.name]
        raise ConfigError(f"task.name = {task_cfg.name!r} needs task.{field}; valid: task.{field}=FILE")
    elif task_cfg.name == "addition":
        name, own = "addition", {"digits": ("digits", task_cfg.digits)}
    else:
        name, own = task_cfg.name, {}
    clash = sorted(set(own) & set(task_cfg.kwargs))
    if clash:
        raise ConfigError(f"task.kwargs sets {clash}, which come from their own fields; valid: "
                          f"{', '.join('task.' + own[k][0] for k in clash)} instead")
    return name, {**{k: value for k, (_, value) in own.items()}, **task_cfg.kwargs}


def check_task_section(task_cfg) -> None:
    """ConfigError naming the field if the task section cannot build its task and grader."""
    try:
        import_task_plugins(task_cfg.plugins)
    except ImportError as err:
        raise ConfigError(f"task.plugins = {task_cfg.plugins!r}: cannot import {err.name or ''} ({err}); "
                          "valid: importable modules (on sys.path: the working directory or PYTHONPATH)") from None
    if task_cfg.data_path:
        try:
            data_file_format(task_cfg.data_path)
        except ValueError as err:
            raise ConfigError(f"task.data_path: {err}") from None
    if task_cfg.name in FILE_TASKS and not (task_cfg.jsonl_path or task_cfg.data_path):
        pass  # the file is left to the user (GPU-scale configs do); build_task names the missing field
    else:
        _check_name_and_kwargs(task_cfg)
    _check_sandbox_deadline(task_cfg)
    if task_cfg.reward_fn is not None:
        task_grader(task_cfg, task_cfg.reward_fn, "task.reward_fn")
    if task_cfg.reward_fns or task_cfg.reward_weights:
        task_graders(task_cfg)
    if task_cfg.env is not None:
        resolve_env_class(task_cfg.env)
    elif task_cfg.env_kwargs:
        raise ConfigError(f"task.env_kwargs = {dict(task_cfg.env_kwargs)!r} is set without task.env; valid: "
                          "task.env='package.module:Class' (a built-in task takes its arguments from task.kwargs)")
    for field in ("reward_fn", "reward_fns"):
        if getattr(task_cfg, field) and is_env_task(task_cfg):
            raise ConfigError(f"task.{field} = {getattr(task_cfg, field)!r} with an environment task (task.name = "
                              f"{task_cfg.name!r}, task.env = {task_cfg.env!r}): the environment's step rewards are "
                              f"the rewards; valid: leave task.{field} unset")
    check_judge_use(task_cfg)


def _check_sandbox_deadline(task_cfg) -> None:
    """A code task's sandbox must hit its own deadline before the pool kills its grader."""
    if task_cfg.name not in CODE_TASKS:
        return
    try:
        wall_s = SandboxLimits.from_mapping(task_cfg.kwargs.get("sandbox")).wall_s
    except ValueError as err:
        raise ConfigError(f"task.kwargs.sandbox: {err}") from None
    if not task_cfg.reward_timeout_s > wall_s + 1.0:
        raise ConfigError(f"task.reward_timeout_s = {task_cfg.reward_timeout_s!r} with the sandbox's wall_s = {wall_s!r}: "
                          f"the pool would stop the grader before the sandbox's own deadline; valid: "
                          f"task.reward_timeout_s > {wall_s + 1.0:g} (wall_s + 1 s for the sandbox to start and stop)")


def task_graders(task_cfg) -> WeightedRewards:
    """task.reward_fns with task.reward_weights as one grader, each part named by its function
    ("pkg.mod:score" -> "score", a built-in by its name)."""
    fns, weights = task_cfg.reward_fns, task_cfg.reward_weights
    if task_cfg.reward_fn is not None and fns:
        raise ConfigError(f"task.reward_fn = {task_cfg.reward_fn!r} and task.reward_fns = {fns!r} are both set; "
                          "valid: one of them (reward_fns=[the one grader, ...] names several)")
    if not fns:
        raise ConfigError(f"task.reward_weights = {weights!r} is set without task.reward_fns; valid: "
                          "task.reward_fns naming one grader per weight")
    if weights and len(weights) != len(fns):
        raise ConfigError(f"task.reward_weights = {weights!r} has {len(weights)} weights for {len(fns)} graders in "
                          f"task.reward_fns; valid: {len(fns)} weights, or none (1 each)")
    names = tuple(spec.rsplit(":", 1)[-1] for spec in fns)
    if len(set(names)) != len(names):
        raise ConfigError(f"task.reward_fns = {fns!r} names two graders alike ({names}); valid: graders whose "
                          "function names differ (each reward is logged as reward_<name>)")
    return WeightedRewards(names, tuple(task_grader(task_cfg, spec, "task.reward_fns") for spec in fns),
                           tuple(weights) or (1.0,) * len(fns))


def resolve_env_class(spec: str) -> Any:
    """The environment class (or factory) `spec` = "package.module:Class" names; a class must
    have the Environment methods reset() and step() (a factory is checked when it is called)."""
    target = _load_callable(spec, "task.env", "a class (or factory) of environments")
    if isinstance(target, type):
        missing = [m for m in ("reset", "step") if not callable(getattr(target, m, None))]
        if missing:
            methods = " or ".join(m + "()" for m in missing)
            raise ConfigError(f"task.env = {spec!r}: class {target.__name__} has no {methods} method; valid: a class with reset(example) -> (observation, info) and step(action_text) "
                              "-> StepResult (jaxrl_llm.data.environments.Environment)")
    return target


def is_env_task(task_cfg) -> bool:
    """Whether the task section's episodes run in an environment (multi-turn): task.env is set or
    task.name is a registered environment task (an EnvTask subclass, e.g. guess_number)."""
    factory = TASK_FACTORIES.get(task_cfg.name)
    return task_cfg.env is not None or (isinstance(factory, type) and issubclass(factory, EnvTask))


def _check_name_and_kwargs(task_cfg) -> None:
    name, kwargs = task_arguments(task_cfg)
    names = task_names()
    if name not in names:
        raise ConfigError(f"task.name = {name!r} is invalid; valid: one of {', '.join(names)}, a task registered by "
                          f"a module in task.plugins, or task.data_path=FILE{did_you_mean(name, names)}")
    try:
        check_task_kwargs(name, kwargs)
    except ValueError as err:
        raise ConfigError(f"task.kwargs = {dict(task_cfg.kwargs)!r} is invalid: {err}") from None


def build_task(task_cfg) -> Task:
    """The task of `task_cfg`, graded by task.reward_fn when that is set, its examples played in
    task.env's environment when that is set."""
    import_task_plugins(task_cfg.plugins)
    name, kwargs = task_arguments(task_cfg)
    try:
        task = make_task(name, **kwargs)
    except DatasetFormatError:
        raise
    except (TypeError, ValueError, ImportError) as err:  # ImportError: an optional package missing, named
        raise ConfigError(f"task.name = {name!r} with task.kwargs = {dict(task_cfg.kwargs)!r}: {err}") from err
    if task_cfg.reward_fn is not None:
        task.reward_fn = task_grader(task_cfg, task_cfg.reward_fn, "task.reward_fn")  # this task's grader only
    if task_cfg.reward_fns:
        task.reward_fn = task_graders(task_cfg)  # called as one grader: the weighted sum
    if task_cfg.judge.enabled and task_cfg.reward_fn is None and not task_cfg.reward_fns:
        task.reward_fn = make_judge(task_cfg)  # the judge alone
    if task_cfg.env is not None:
        env_class = resolve_env_class(task_cfg.env)
        return PluginEnvTask(task, env_class, dict(task_cfg.env_kwargs))
    return task
