"""Grading code by running it: a completion's fenced Python block against an example's tests.

An example graded by :func:`code_reward` carries in its ``metadata``:

  tests:       list of Python snippets, each a test (``assert f(2) == 5``) that calls the
               program's function by name (see :mod:`jaxrl_llm.rewards.code_tests`).
  entry_point: the function the tests call (default ``"f"``).
  test_setup:  optional trusted code run before a replayed test (HumanEval: the prompt's
               helpers and the check's preamble); never sent to the sandbox.
  tolerance:   optional absolute float tolerance of the compare tests (default 0).
  scoring:     "fraction" (reward = passed / len(tests)) or "all" (1.0 only if every test passes).
  sandbox:     optional mapping of :class:`jaxrl_llm.rewards.sandbox.SandboxLimits` fields.

The program is the last fenced code block of the completion (:func:`extract_code_block`);
a completion without one scores 0. The verdict never depends on the program's objects or
code: the program runs in the sandbox and only answers calls with plain data
(:mod:`jaxrl_llm.rewards.sandbox_session`); the tests, their expected values and the
comparison stay in this process (:mod:`jaxrl_llm.rewards.code_tests`). The reward is a count
of tests over their number, so it lies in [0, 1] (``code_reward.reward_range``).

Counting (as for every grader in a :class:`GraderPool`): a sandbox killed at its wall-clock
deadline raises :class:`GraderTimeout` (status "timeout"); one that printed past its output
cap, or stopped answering (a CPU, memory or process limit hit, a crash, its result channel
closed), raises :class:`CodeRunError` (status "error"). Both score 0, partial passes included.
A program whose result's class has an ``__eq__`` of its own (an always-equal object or ``str``
subclass), or that put bytes on the result channel that the runner never writes, gets
:class:`Suspected` (the reward of the tests it passed honestly, counted as a suspected
forgery). A sandbox that cannot run at all (:func:`probe_sandbox`, run by each grading worker
before its first answer) stops the batch with ``SandboxUnavailable`` instead of scoring everything 0.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterable, Mapping

from jaxrl_llm.rewards.code_tests import CompareTest, ReplayTest, parse_test, recorded_calls, replay
from jaxrl_llm.rewards.extract import extract_code_block
from jaxrl_llm.rewards.plain_data import plain_equal
from jaxrl_llm.rewards.pool_worker import GraderTimeout, Suspected
from jaxrl_llm.rewards.sandbox import SandboxLimits
from jaxrl_llm.rewards.sandbox_session import Call, CallResult, SandboxSession, probe_sandbox

SCORINGS = ("fraction", "all")
MAX_ROUNDS = 4  # batches of calls per program: the recorded ones, then those replays found missing


class CodeRunError(RuntimeError):
    """The sandboxed program was stopped or died before answering every call."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The tests' outcomes for one program and what its sandbox did."""

    passed: tuple[bool, ...]
    results: dict[str, CallResult]
    session: SandboxSession
    rounds: int  # batches of calls sent: 1, or more when replayed tests' arguments depend on results

    @property
    def suspect(self) -> str | None:
        return next((r.suspect for r in self.results.values() if r.suspect), None) or self.session.suspect


def check_scoring(scoring: str) -> str:
    if scoring not in SCORINGS:
        raise ValueError(f"code scoring {scoring!r} is not valid; use one of {SCORINGS}")
    return scoring


def code_tests(metadata: Mapping[str, Any]) -> list[str]:
    tests = metadata.get("tests")
    if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"code example metadata 'tests' must be a non-empty list of strings, got {tests!r:.120}")
    return list(tests)


def parsed_tests(metadata: Mapping[str, Any]) -> tuple[CompareTest | ReplayTest, ...]:
    """The example's tests by kind (cached: a task's examples come back every step)."""
    entry_point = metadata.get("entry_point", "f")
    setup = metadata.get("test_setup", "")
    if not (isinstance(entry_point, str) and entry_point.isidentifier()) or not isinstance(setup, str):
        raise ValueError(f"code example metadata 'entry_point' must be a function name and 'test_setup' a "
                         f"string, got {entry_point!r:.60} and {type(setup).__name__}")
    return _parse_all(tuple(code_tests(metadata)), entry_point, setup)


@functools.lru_cache(maxsize=4096)
def _parse_all(tests: tuple[str, ...], entry_point: str, setup: str) -> tuple[CompareTest | ReplayTest, ...]:
    return tuple(parse_test(source, entry_point, setup) for source in tests)


def judge(program: str, tests: tuple[CompareTest | ReplayTest, ...], limits: SandboxLimits,
          tolerance: float = 0.0) -> Verdict:
    """Run ``program`` in a sandbox, ask it every call the tests make, judge each test here."""
    results: dict[str, CallResult] = {}
    passed: list[bool | None] = [None] * len(tests)
    with SandboxSession(program, limits) as session:
        first = [t.call for t in tests if isinstance(t, CompareTest)]
        first += [c for t in tests if isinstance(t, ReplayTest) for c in recorded_calls(t)]
        _ask(session, first, results)
        rounds = 1
        while True:
            missing = []
            for index, test in enumerate(tests):
                if isinstance(test, ReplayTest) and passed[index] is None:
                    outcome = replay(test, results)
                    if isinstance(outcome, Call):
                        missing.append(outcome)
                    else:
                        passed[index] = outcome
            if not missing or rounds == MAX_ROUNDS:
                break
            _ask(session, missing, results)
            rounds += 1
    for index, test in enumerate(tests):
        if isinstance(test, CompareTest):
            result = results[test.call.key()]
            passed[index] = result.error is None and plain_equal(result.value, test.expected, tolerance)
    return Verdict(tuple(p is True for p in passed), results, session, rounds)


def _ask(session: SandboxSession, calls: Iterable[Call], results: dict[str, CallResult]) -> None:
    """The calls not asked yet (each distinct call once), answered into ``results``."""
    new = {}
    for call in calls:
        key = call.key()
        if key not in results:
            new.setdefault(key, call)
    for key, result in zip(new, session.call(list(new.values()))):
        results[key] = result


def score(verdict: Verdict, scoring: str, limits: SandboxLimits) -> float | Suspected:
    """The reward of a judged program, or the exception that counts it as timeout/error."""
    run = verdict.session.run
    if run.timed_out:
        raise GraderTimeout(f"program ran past the sandbox's {limits.wall_s:g} s wall-clock limit")
    if run.output_capped:
        raise CodeRunError(f"program printed more than {limits.output_bytes} bytes; sandbox killed")
    unanswered = sum(r.unanswered for r in verdict.results.values())
    suspect = verdict.suspect
    if unanswered and suspect is None:
        raise CodeRunError(f"sandbox exited with code {run.exit_code} after answering {len(verdict.results) - unanswered}"
                           f" of {len(verdict.results)} calls (a limit hit or a crash); output: {run.output[-200:]!r}")
    n_passed = sum(verdict.passed)
    reward = float(n_passed == len(verdict.passed)) if scoring == "all" else n_passed / len(verdict.passed)
    return reward if suspect is None else Suspected(reward, suspect)


def _warm_up_sandbox() -> None:
    probe_sandbox()


def code_reward(completion: str, example: Any) -> float | Suspected:
    """Fraction (or all-or-nothing) of the example's tests the completion's code passes."""
    metadata = example.metadata
    tests = parsed_tests(metadata)
    scoring = check_scoring(metadata.get("scoring", "fraction"))
    limits = SandboxLimits.from_mapping(metadata.get("sandbox"))
    tolerance = metadata.get("tolerance", 0.0)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < math.inf:
        raise ValueError(f"code example metadata 'tolerance' must be a finite number >= 0, got {tolerance!r:.60}")
    program = extract_code_block(completion)
    if program is None:
        return 0.0
    return score(judge(program, tests, limits, float(tolerance)), scoring, limits)


code_reward.warm_up = _warm_up_sandbox  # a grading worker checks the sandbox once, before any deadline
code_reward.reward_range = (0.0, 1.0)  # the pool clips to it and counts a value outside as a suspected forgery
