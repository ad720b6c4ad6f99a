"""A code example's tests, judged in the grader's process on plain data from the sandbox.

A test is Python source (``assert f(2) == 5``) that calls the program's function by its name
(the example's ``entry_point``, default ``f``). The tests are the task's own code, trusted as a
reward function is; the program is not. Each test is one of two kinds (:func:`parse_test`):

- :class:`CompareTest`: exactly ``assert <entry>(<literals>) == <literal>`` (or ``is`` None,
  True, False). The call goes to the sandbox; its plain-data result is compared here with
  :func:`plain_data.plain_equal` (type-exact: True is not 1, 1 is not 1.0, a tuple is not a
  list), with the example's ``tolerance`` for floats.
- :class:`ReplayTest`: anything else (tolerances as ``abs(...) < 1e-6``, ``isinstance``, loops,
  helpers). Its source runs here, in a namespace made by the example's ``test_setup`` (trusted
  code: HumanEval's prompt and check preamble), with the entry point replaced by a proxy:
  1. record: the test runs against :class:`Anything` results, its asserts only evaluated
     (a false one does not stop it); the proxy records each call's arguments (no program
     involved; cached per test);
  2. the recorded calls go to the sandbox in one batch with the compare tests' calls;
  3. replay: the test runs again, the proxy returning each recorded call's plain-data result
     (a fresh copy per call); a call that raised or returned something not plain raises
     :class:`CallFailed` (a BaseException: the test cannot catch it), and the test fails.
     A call not recorded in step 1 (its arguments depend on earlier results) raises
     :class:`MissingCall`; the grader asks the sandbox for those and replays again.
  Python's ``==`` applies inside a replayed test, on the built-in values the grader decoded.

The global ``random`` state is seeded to 0 before each record and replay (and restored after),
so tests that draw random inputs ask the same calls in both.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import random
from typing import Any, Callable, Mapping

from jaxrl_llm.rewards import plain_data
from jaxrl_llm.rewards.sandbox_session import Call, CallResult

MAX_RECORDED_CALLS = 10_000  # per test; a test asking more fails


@dataclasses.dataclass(frozen=True)
class CompareTest:
    """``assert <entry>(<args>) == <expected>``: one call, compared type-exactly in the grader."""

    call: Call
    expected: Any


@dataclasses.dataclass(frozen=True)
class ReplayTest:
    """A test run in the grader against the program's plain-data results (module doc)."""

    source: str
    setup: str
    entry_point: str


class CallFailed(BaseException):
    """The program's call raised, returned non-plain data, or got no answer."""


class MissingCall(BaseException):
    """A replayed test made a call whose result was not asked for yet."""

    def __init__(self, call: Call):
        super().__init__(call)
        self.call = call


class _RecordingDone(BaseException):
    pass


def parse_test(source: str, entry_point: str, setup: str = "") -> CompareTest | ReplayTest:
    """The test's kind (module doc); the source is trusted task text, parsed, not run."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"code test is not valid Python ({exc.msg}, line {exc.lineno}): {source!r:.120}") from None
    node = tree.body[0] if len(tree.body) == 1 else None
    test = node.test if isinstance(node, ast.Assert) else None
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Call)
            and isinstance(test.left.func, ast.Name) and test.left.func.id == entry_point and not test.left.keywords
            and not any(isinstance(a, ast.Starred) for a in test.left.args)):
        try:
            args = tuple(ast.literal_eval(a) for a in test.left.args)
            expected = ast.literal_eval(test.comparators[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        else:
            is_identity = isinstance(test.ops[0], ast.Is) and expected in (None, True, False)
            call = Call(entry_point, args)
            if (isinstance(test.ops[0], ast.Eq) or is_identity) and _sendable(call):
                return CompareTest(call, expected)
    return ReplayTest(source, setup, entry_point)


def _sendable(call: Call) -> bool:
    try:
        call.key()
    except (ValueError, TypeError, RecursionError):
        return False
    return True


class Anything:
    """What a call returns while a test is recorded: every operation gives an Anything back,
    it is true, empty when iterated, 0 as a number, so the test runs on to its later calls."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __bool__(self):
        return True

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __index__(self):
        return 0

    def __float__(self):
        return 0.0

    def __hash__(self):
        return 0

    def __contains__(self, item):
        return True

    def __repr__(self):
        return "Anything()"

    __int__ = __index__
    __str__ = __repr__


def _absorb(self, *args):
    return self


for _name in ("eq ne lt le gt ge add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow rpow "
              "neg pos abs invert and rand or ror xor rxor lshift rlshift rshift rrshift getitem round").split():
    setattr(Anything, f"__{_name}__", _absorb)


class _AssertsEvaluated(ast.NodeTransformer):
    """``assert cond, msg`` -> ``cond``: while recording, a failed assert must not end the test."""

    def visit_Assert(self, node):
        return ast.copy_location(ast.Expr(self.visit(node.test)), node)


def _run(test: ReplayTest, proxy: Callable, recording: bool = False) -> None:
    """The test's source in a fresh namespace of its setup, the entry point replaced by ``proxy``
    (while recording, its asserts only evaluate their conditions)."""
    namespace: dict[str, Any] = {"__name__": "__code_test__"}
    tree = ast.parse(test.source)
    if recording:
        tree = ast.fix_missing_locations(_AssertsEvaluated().visit(tree))
    state = random.getstate()
    try:
        exec(compile(test.setup, "<test setup>", "exec"), namespace)
        namespace[test.entry_point] = proxy
        random.seed(0)
        exec(compile(tree, "<test>", "exec"), namespace)
    finally:
        random.setstate(state)


@functools.lru_cache(maxsize=4096)
def recorded_calls(test: ReplayTest) -> tuple[Call, ...]:
    """The calls ``test`` makes when every call returns :class:`Anything` (step 1)."""
    calls: dict[str, Call] = {}

    def record(*args, **kwargs):
        if kwargs:
            raise TypeError("code tests call the program with positional arguments only")
        if len(calls) >= MAX_RECORDED_CALLS:
            raise _RecordingDone
        try:  # a copy: the test may change its arguments after the call
            call = Call(test.entry_point, tuple(plain_data.decode(plain_data.encode(list(args)))))
            calls.setdefault(call.key(), call)
        except (ValueError, TypeError, RecursionError):  # an argument that is not plain data: fails at replay
            pass
        return Anything()

    try:
        _run(test, record, recording=True)
    except BaseException:  # the recording stops where the test does; replay asks the rest
        pass
    return tuple(calls.values())


def replay(test: ReplayTest, results: Mapping[str, CallResult]) -> bool | Call:
    """Whether ``test`` passes with the program's ``results`` (by :meth:`Call.key`); a Call
    instead when it needs one not yet in ``results`` (step 3)."""
    def answer(*args, **kwargs):
        call = Call(test.entry_point, tuple(args))
        try:
            key = call.key()
        except (ValueError, TypeError) as exc:
            raise CallFailed(f"argument not plain data: {exc}") from None
        if kwargs or key not in results:
            if kwargs:
                raise CallFailed("keyword arguments")
            raise MissingCall(call)
        result = results[key]
        if result.error is not None:
            raise CallFailed(result.error)
        return plain_data.decode(plain_data.encode(result.value))  # a fresh copy: the test may mutate it

    try:
        _run(test, answer)
    except MissingCall as missing:
        return missing.call
    except (Exception, CallFailed, RecursionError):
        return False
    return True
