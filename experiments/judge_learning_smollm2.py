"""Experiment 13's deciding setting, SmolLM2-135M-Instruct as the policy: judge_learning.py --setting smollm2,
under a name of its own. Its stored result (experiments/results/judge_learning_smollm2.json) sits beside the
tiny setting's (judge_learning.json), and the results table and its tests find a result's CLAIM, VERDICT_RULE
and rule_verdict in experiments/<result name>.py: here, the smollm2 setting's, from judge_learning.py.

    python experiments/judge_learning_smollm2.py --results experiments/results/judge_learning_smollm2.json
    (the same as: python experiments/judge_learning.py --setting smollm2 --results ...)
"""
from __future__ import annotations

import sys
from typing import Sequence

from judge_learning import RESULTS, VERDICT_RULE, rule_verdict  # noqa: F401  (the table's lookups)

CLAIM = RESULTS["smollm2"].claim


def main(argv: Sequence[str] | None = None) -> int:
    from judge_learning import main as judge_main

    return judge_main(["--setting", "smollm2", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
