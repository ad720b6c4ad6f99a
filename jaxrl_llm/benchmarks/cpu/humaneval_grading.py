"""HumanEval through the code grader: every canonical solution must score 1 and wrong ones 0.

    python -m jaxrl_llm.benchmarks.cpu.humaneval_grading [--workers 1] [--out FILE]

Grades, through the training loop's path (GraderPool, code_reward, the humaneval task's
examples with its default "all" scoring and sandbox limits), three answers per problem: the
canonical solution, the stub returning None, and the stub with the NEXT problem's canonical
body (a real solution of the wrong problem). Counts the problems at each reward, and sorts the
problems by how the grader judges their tests (jaxrl_llm/rewards/code_tests.py): all asserts
compared calls, some asserts replayed, the whole check replayed (not assert-only); and how
many sandbox rounds the canonical solution needed. Prints one JSON object; --out writes it too.
"""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

from jaxrl_llm.data.code_tasks import HumanEvalTask, load_humaneval
from jaxrl_llm.rewards import GraderPool, SandboxLimits, code_reward, extract_code_block
from jaxrl_llm.rewards.code_grader import judge, parsed_tests
from jaxrl_llm.rewards.code_tests import CompareTest


def answers(problems: list[dict]) -> dict[str, list[str]]:
    """The three answers of each problem, by kind, in the problems' order."""
    fence = "```python\n{}```"
    nxt = problems[1:] + problems[:1]
    return {"canonical": [fence.format(p["prompt"] + p["canonical_solution"]) for p in problems],
            "return_none": [fence.format(p["prompt"] + "    return None\n") for p in problems],
            "next_problem_s_solution": [fence.format(p["prompt"] + q["canonical_solution"]) for p, q in zip(problems, nxt)]}


def category(tests) -> str:
    if all(isinstance(t, CompareTest) for t in tests):
        return "compared_calls_only"
    return "some_asserts_replayed" if len(tests) > 1 or isinstance(tests[0], CompareTest) else "whole_check_replayed"


def measure(workers: int = 1, problem_ids: list[str] | None = None) -> dict:
    """The counts of the module doc, over every problem or ``problem_ids``."""
    task = HumanEvalTask()
    by_id = {p["task_id"]: p for p in load_humaneval()}
    examples = [e for e in task._examples if problem_ids is None or e.id.removeprefix("humaneval/") in problem_ids]
    problems = [by_id[e.id.removeprefix("humaneval/")] for e in examples]
    started = time.monotonic()
    out: dict = {"problems": len(problems), "rewards": {}, "not_as_expected": {}}
    with GraderPool(workers, timeout_s=60) as pool:
        for kind, texts in answers(problems).items():
            result = pool.grade(code_reward, texts, examples)
            want = 1.0 if kind == "canonical" else 0.0
            out["rewards"][kind] = dict(collections.Counter(str(r) for r in result.rewards))
            out["not_as_expected"][kind] = [p["task_id"] for p, r in zip(problems, result.rewards) if r != want]
            out.setdefault("forgery_suspected", {})[kind] = result.n_forgery_suspected
    kinds = {e.id.removeprefix("humaneval/"): category(parsed_tests(e.metadata)) for e in examples}
    out["categories"] = {c: sorted((i for i, k in kinds.items() if k == c), key=lambda i: int(i.split("/")[1]))
                         for c in ("compared_calls_only", "some_asserts_replayed", "whole_check_replayed")}
    out["category_counts"] = {c: len(ids) for c, ids in out["categories"].items()}
    tests = [t for e in examples for t in parsed_tests(e.metadata)]
    out["tests"] = {"compared": sum(isinstance(t, CompareTest) for t in tests),
                    "replayed": sum(not isinstance(t, CompareTest) for t in tests)}
    replayed = [e for e in examples if kinds[e.id.removeprefix("humaneval/")] != "compared_calls_only"]
    rounds = {e.id.removeprefix("humaneval/"): judge(extract_code_block(e.answer), parsed_tests(e.metadata),
                                                      SandboxLimits.from_mapping(e.metadata["sandbox"])).rounds
              for e in replayed}
    out["canonical_rounds_over_1"] = sorted(i for i, r in rounds.items() if r > 1)
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    out = measure(args.workers)
    text = json.dumps(out, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
