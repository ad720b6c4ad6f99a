"""Grading code by running it: a completion's fenced Python block against an example's tests.

An example graded by :func:`code_reward` carries in its ``metadata``:

  tests:    list of Python snippets, each a test (``assert f(2) == 5``); a test passes when
            it runs without raising after the program was run.
  scoring:  "fraction" (reward = passed / len(tests)) or "all" (1.0 only if every test passes).
  sandbox:  optional mapping of :class:`jaxrl_llm.rewards.sandbox.SandboxLimits` fields.

The program is the last fenced code block of the completion (:func:`extract_code_block`);
a completion without one scores 0. The program and tests run only inside the sandbox
(:mod:`jaxrl_llm.rewards.sandbox`), never in this process.

Counting (as for every grader in a :class:`GraderPool`): a sandbox killed at its wall-clock
deadline raises :class:`GraderTimeout` (status "timeout"); one that printed past its output
cap, or died before reporting every test (a CPU, memory or process limit hit, a crash),
raises :class:`CodeRunError` (status "error"). Both score 0, partial passes included. A
sandbox that cannot run at all (:func:`probe_sandbox`, run by each grading worker before its
first answer) stops the batch with ``SandboxUnavailable`` instead of scoring everything 0.
"""
from __future__ import annotations

from typing import Any, Mapping

from jaxrl_llm.rewards.extract import extract_code_block
from jaxrl_llm.rewards.pool_worker import GraderTimeout
from jaxrl_llm.rewards.sandbox import SandboxLimits, SandboxRun, probe_sandbox, run_in_sandbox

SCORINGS = ("fraction", "all")


class CodeRunError(RuntimeError):
    """The sandboxed program was stopped or died before every test reported."""


def check_scoring(scoring: str) -> str:
    if scoring not in SCORINGS:
        raise ValueError(f"code scoring {scoring!r} is not valid; use one of {SCORINGS}")
    return scoring


def code_tests(metadata: Mapping[str, Any]) -> list[str]:
    tests = metadata.get("tests")
    if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"code example metadata 'tests' must be a non-empty list of strings, got {tests!r:.120}")
    return list(tests)


def score_run(run: SandboxRun, n_tests: int, scoring: str, limits: SandboxLimits) -> float:
    """The reward of a finished sandbox run, or the exception that counts it as timeout/error."""
    if run.timed_out:
        raise GraderTimeout(f"program ran past the sandbox's {limits.wall_s:g} s wall-clock limit")
    if run.output_capped:
        raise CodeRunError(f"program printed more than {limits.output_bytes} bytes; sandbox killed")
    if run.n_reported < n_tests:
        raise CodeRunError(f"sandbox exited with code {run.exit_code} after {run.n_reported} of {n_tests} "
                           f"tests (a limit hit or a crash); output: {run.output[-200:]!r}")
    if scoring == "all":
        return float(len(run.passed) == n_tests)
    return len(run.passed) / n_tests


def _warm_up_sandbox() -> None:
    probe_sandbox()


def code_reward(completion: str, example: Any) -> float:
    """Fraction (or all-or-nothing) of the example's tests the completion's code passes."""
    metadata = example.metadata
    tests = code_tests(metadata)
    scoring = check_scoring(metadata.get("scoring", "fraction"))
    limits = SandboxLimits.from_mapping(metadata.get("sandbox"))
    program = extract_code_block(completion)
    if program is None:
        return 0.0
    return score_run(run_in_sandbox(program, tests, limits), len(tests), scoring, limits)


code_reward.warm_up = _warm_up_sandbox  # a grading worker checks the sandbox once, before any deadline
