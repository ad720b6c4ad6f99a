"""The task registry: names a config can give as ``task.name``, each bound to a factory.

Built-in tasks and a user's own are registered the same way::

    from jaxrl_llm.data import Task, register_task

    @register_task("my_task")
    class MyTask(Task):          # or a function returning a Task
        def __init__(self, level: int = 1, *, heldout_fraction: float = 0.3): ...

A config reaches a user's task by listing the module that registers it in
``task.plugins`` (imported before the name is looked up) and naming it in
``task.name``; ``task.kwargs`` become the factory's keyword arguments, checked
against its signature before the task is built.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Mapping, Sequence

from jaxrl_llm.data.task_base import Task

TaskFactory = Callable[..., Task]

TASK_FACTORIES: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """Decorator registering a Task class or factory function as ``name``.

    Registering a second, different definition under a taken name is an error;
    registering the same definition again (a module imported twice) replaces it.
    """
    if not isinstance(name, str) or not name.strip() or ":" in name or name != name.strip():
        raise ValueError(f"task name {name!r} is invalid; valid: a non-empty name without ':' or surrounding spaces")

    def register(factory: TaskFactory) -> TaskFactory:
        if not callable(factory):
            raise TypeError(f"register_task({name!r}) decorates a Task class or a function, got {factory!r}")
        known = TASK_FACTORIES.get(name)
        if known is not None and not _same_definition(known, factory):
            raise ValueError(f"task {name!r} is already registered to {'.'.join(_qualified(known))}; "
                             f"cannot register {'.'.join(_qualified(factory))} under the same name")
        TASK_FACTORIES[name] = factory
        return factory

    return register


def _qualified(factory: TaskFactory) -> tuple[str, str]:
    return getattr(factory, "__module__", "?"), getattr(factory, "__qualname__", repr(factory))


def _same_definition(known: TaskFactory, factory: TaskFactory) -> bool:
    """The same definition imported again: the same module and name, or a user file imported
    under a second name (run as `__main__`, then imported as `experiments.x` by a worker).
    A built-in task is never replaced by a definition from another module."""
    (m1, q1), (m2, q2) = _qualified(known), _qualified(factory)
    if q1 != q2:
        return False
    if m1 == m2:
        return True
    if m1.startswith("jaxrl_llm.") or m2.startswith("jaxrl_llm."):
        return False
    return "__main__" in (m1, m2) or m1.endswith("." + m2) or m2.endswith("." + m1)


def task_names() -> tuple[str, ...]:
    return tuple(sorted(TASK_FACTORIES))


def import_task_plugins(modules: Sequence[str]) -> None:
    """Import each module (``"package.module"``) so its ``@register_task`` runs."""
    for module in modules:
        importlib.import_module(module)


def task_factory(name: str) -> TaskFactory:
    if name not in TASK_FACTORIES:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(task_names())}")
    return TASK_FACTORIES[name]


def accepted_arguments(name: str) -> tuple[tuple[str, ...], bool]:
    """(keyword arguments task ``name`` accepts, whether it also takes arbitrary ones)."""
    parameters = inspect.signature(task_factory(name)).parameters.values()
    named = tuple(p.name for p in parameters
                  if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def check_task_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    """ValueError naming the task and what it accepts if ``kwargs`` cannot be passed to it."""
    named, open_ended = accepted_arguments(name)
    parameters = inspect.signature(task_factory(name)).parameters
    unknown = [] if open_ended else sorted(set(kwargs) - set(named))
    missing = [n for n in named if parameters[n].default is inspect.Parameter.empty and n not in kwargs]
    if unknown or missing:
        problem = (f"unknown argument(s) {', '.join(map(repr, unknown))}" if unknown
                   else f"missing required argument(s) {', '.join(map(repr, missing))}")
        accepts = ", ".join(named) or "no arguments"
        raise ValueError(f"task {name!r}: {problem}; it accepts: {accepts}"
                         f"{' (and further keyword arguments)' if open_ended else ''}")


def make_task(name: str, **kwargs: Any) -> Task:
    """Build the task registered as ``name`` with its keyword arguments.

    make_task("addition", digits=1); make_task("chain_sum", min_terms=2);
    make_task("reasoning_gym", dataset="maze"); make_task("jsonl", path="x.jsonl").
    """
    check_task_kwargs(name, kwargs)
    task = task_factory(name)(**kwargs)
    if not isinstance(task, Task):
        raise TypeError(f"task {name!r}: its factory returned {type(task).__name__}, expected a "
                        "jaxrl_llm.data.Task")
    return task
