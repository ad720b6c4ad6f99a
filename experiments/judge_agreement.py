"""How well a judge separates right from wrong answers: 1-digit additions (a in 1..5, b in 3..6), each
answered once right and once off by one, judged with experiments/judge.py's few-shot rubric and with the
default rubric of task.judge (train/config/judge.py); per rubric and kind, the answers with a parseable
score and their mean score. Needs a running vLLM server serving the judge:

    python experiments/judge_agreement.py --url http://127.0.0.1:8000 [--max-tokens 32]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from jaxrl_llm.rewards import ScoreFormat, judge_prompt
from jaxrl_llm.rollout.judge_client import JudgeClient, served_model
from jaxrl_llm.train.config import load_config
from jaxrl_llm.train.config.judge import DEFAULT_FORMAT, DEFAULT_RUBRIC

RUBRIC = load_config(Path(__file__).with_name("judge.py")).task.judge.rubric


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    fmt = ScoreFormat.parse(DEFAULT_FORMAT)
    rows = [(f"What is {a} + {b}? Answer with just the number.", str(a + b + off), off == 0)
            for a in range(1, 6) for b in range(3, 7) for off in (0, 1)]
    with JudgeClient([args.url], model=served_model([args.url]), max_tokens=args.max_tokens) as client:
        for name, rubric in (("few-shot (experiments/judge.py)", RUBRIC), ("default (task.judge)", DEFAULT_RUBRIC)):
            answers = client.complete([judge_prompt(rubric, q, r) for q, r, _ in rows])
            scores = [fmt.score(a) if isinstance(a, str) else None for a in answers]
            for right in (True, False):
                kind = [s for (_, _, r), s in zip(rows, scores) if r == right]
                parsed = [s for s in kind if s is not None]
                mean = sum(parsed) / len(parsed) if parsed else float("nan")
                print(f"{name:32s} {'right' if right else 'off by one':10s} parseable {len(parsed)}/{len(kind)} "
                      f"mean score {mean:.2f}")


if __name__ == "__main__":
    main()
