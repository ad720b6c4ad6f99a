"""Text environments for multi-turn RL: the gym-style interface and the tasks built on it.

An environment is one episode's counterpart of the policy, in the style of Gymnasium
(Towers et al. 2024, arXiv 2407.17032) and of GEM, a gym for agentic LLMs (Liu et al.
2025, arXiv 2510.01051), with text in and out:

    env = task.make_env()                          # one instance per episode
    observation, info = env.reset(example)         # the first user message
    result = env.step(action_text)                 # the policy's turn, EOS removed
    result.observation, result.reward, result.terminated, result.truncated, result.info

`terminated` means the episode reached its end (an answer was given); `truncated` that
the environment stopped it early. The rollout side (train/sample/episodes.py) adds its own
limits (turns, tokens) on top. Known `info` keys the runner counts: ``tool_call`` and
``tool_error`` (bools). An observation is a str (one user turn) or a list of chat messages
(``{"role": ..., "content": str}`` dicts: a system prompt, few-shot turns, tool results), which
the runner renders with the policy's chat template.

A task whose episodes run in an environment is an :class:`EnvTask`: a `Task` (examples,
splits, `is_correct`) that also makes environments. :class:`SingleTurnEnv` is the
one-step environment of any grader, so a single-turn task is the one-turn case of the
same interface; the training loop keeps its batched single-turn path for those tasks
(docs/architecture.md, "Multi-turn environments").
"""
from __future__ import annotations

import abc
import math
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

from jaxrl_llm.data.records import Example
from jaxrl_llm.data.task_base import Task


class StepResult(NamedTuple):
    """What `Environment.step` returns (fields by name; a plain 5-tuple is refused)."""

    observation: str | list  # the next user message, or chat messages (see the module docstring); "" at the end
    reward: float
    terminated: bool
    truncated: bool = False
    info: dict | None = None  # None: {}


class EnvironmentOutputError(ValueError):
    """An environment returned something malformed; the message names the environment class."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (a new instance per episode)."""

    def reset(self, example: Example) -> tuple[str, dict]:
        """The first observation (the first user message) and an info dict."""
        ...

    def step(self, action_text: str) -> StepResult:
        """The policy's turn as text (end-of-turn token removed) -> the environment's answer."""
        ...


def _name(env: Any) -> str:
    cls = type(env)
    return f"{cls.__module__}.{cls.__qualname__}"


def checked_reset(env: Any, example: Example) -> tuple[str, dict]:
    """`env.reset(example)`, with its output checked (errors name the environment class)."""
    out = env.reset(example)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise EnvironmentOutputError(f"environment {_name(env)}.reset returned {type(out).__name__} {out!r:.80}; "
                                     "expected (observation: str, info: dict)")
    observation, info = out
    _check_observation(env, observation, "reset")
    _check_info(env, info, "reset")
    return observation, info


def checked_step(env: Any, action_text: str) -> StepResult:
    """`env.step(action_text)`, with its output checked: a StepResult with a str observation,
    a finite float reward and bool flags (errors name the environment class)."""
    out = env.step(action_text)
    if not isinstance(out, StepResult):
        raise EnvironmentOutputError(
            f"environment {_name(env)}.step returned {type(out).__name__} {out!r:.80}; expected a "
            "jaxrl_llm.data.environments.StepResult(observation, reward, terminated, truncated, info)")
    _check_observation(env, out.observation, "step")
    if out.info is None:
        out = out._replace(info={})
    _check_info(env, out.info, "step")
    reward = out.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
        raise EnvironmentOutputError(f"environment {_name(env)}.step returned reward {reward!r}; expected a finite "
                                     "float (not NaN/inf, not a bool or string)")
    for flag in ("terminated", "truncated"):
        if not isinstance(getattr(out, flag), bool):
            raise EnvironmentOutputError(f"environment {_name(env)}.step returned {flag}="
                                         f"{getattr(out, flag)!r}; expected a bool")
    return out._replace(reward=float(reward))


def _check_observation(env: Any, observation: Any, method: str) -> None:
    if isinstance(observation, str) or (isinstance(observation, list) and observation and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in observation)):
        return
    raise EnvironmentOutputError(f"environment {_name(env)}.{method} returned observation {observation!r:.80} "
                                 f"of type {type(observation).__name__}; expected a str or a non-empty list of "
                                 "{'role': str, 'content': str} chat messages")


def _check_info(env: Any, info: Any, method: str) -> None:
    if not isinstance(info, dict):
        raise EnvironmentOutputError(f"environment {_name(env)}.{method} returned info {info!r:.80}; expected a dict")


class SingleTurnEnv:
    """The one-step environment of a single-turn task: the prompt, then the grader's reward."""

    def __init__(self, reward_fn: Callable[[str, Example], float]):
        self.reward_fn = reward_fn
        self.example: Example | None = None

    def reset(self, example: Example) -> tuple[str, dict]:
        self.example = example
        return example.prompt, {}

    def step(self, action_text: str) -> StepResult:
        return StepResult("", float(self.reward_fn(action_text, self.example)), terminated=True)


class EnvTask(Task):
    """A task whose episodes run in an environment: examples as any task, plus `make_env`."""

    @abc.abstractmethod
    def make_env(self) -> Environment:
        """A fresh environment for one episode."""

    def reward_fn(self, completion: str, example: Example) -> float:
        """The reward of `completion` played as a one-turn episode: what the environment gives
        a first reply (0 unless that reply ends the episode). Training and evaluation play
        whole episodes (train/sample/episodes.py); this is the Task attribute for other callers."""
        env = self.make_env()
        checked_reset(env, example)
        result = checked_step(env, completion)
        return result.reward if result.terminated else 0.0


class PluginEnvTask(EnvTask):
    """The examples of `base` played in a user's environment class (``task.env="pkg.mod:Class"``):
    each episode is ``env_class(**env_kwargs)`` reset with one of `base`'s examples."""

    def __init__(self, base: Task, env_class: Callable[..., Any], env_kwargs: dict[str, Any] | None = None):
        self.base, self.env_class, self.env_kwargs = base, env_class, dict(env_kwargs or {})
        self.name = base.name
        self.heldout_fraction = base.heldout_fraction
        self.correct_threshold = base.correct_threshold
        if hasattr(base, "all_examples"):
            self.all_examples = base.all_examples

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        return self.base.examples(split, n, seed=seed, unique=unique)

    def make_env(self) -> Environment:
        env = self.env_class(**self.env_kwargs)
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise EnvironmentOutputError(f"environment {_name(env)} has no {method}() method; an environment "
                                             "needs reset(example) -> (str, dict) and step(text) -> StepResult")
        return env
