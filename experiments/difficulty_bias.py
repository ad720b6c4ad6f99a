"""Experiment 3: difficulty bias of std-normalised advantages.

Question (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1): for binary
rewards, dividing the group-centred advantage by the group's std re-weights
prompts by 1/std: how does the per-prompt gradient weight depend on the
group's success rate p, analytically and in the groups of a real run?

    python experiments/difficulty_bias.py --quick      # ~4 min: one GRPO run of 6 steps, or
    python experiments/difficulty_bias.py --runs runs/experiments/length_bias/quick/grpo \\
        runs/experiments/length_bias/quick/dr_grpo runs/experiments/length_bias/quick/dapo
    jaxrl train --config experiments/difficulty_bias.py:gpu    # GPU-scale run to measure

Without --runs it measures the length-bias experiment's runs when they exist
(same --quick size) and otherwise trains its own. Writes to
runs/experiments/difficulty_bias/<quick|full>/: difficulty_bias.png,
summary.md / .json, run_info.json.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from base_configs import addition_config
from jaxrl_llm.reports import difficulty
from jaxrl_llm.reports.runs import experiment_parser, output_dir, train_or_resume, variant_config, write_summary
from jaxrl_llm.train.config import Config

NAME = "difficulty_bias"
QUICK = ("total_steps=6", "rollout.prompts_per_step=4")


def get_config(arg: str = "") -> Config:
    """ARG = "" (CPU) or "gpu". A GRPO run whose groups are measured."""
    return addition_config(f"{NAME}_grpo", "" if arg == "cpu" else arg, recipe="grpo", total_steps=30,
                           max_tokens=32, seed=1)



# ------------------------------------------------------------- the verdict rule (issue 36)
CLAIM = "the group-std normaliser up-weights too-easy and too-hard prompts (Liu et al. 2025, arXiv 2503.20783)"
VERDICT_RULE = ("an identity on logged groups, no seed noise: reproduced if the measured E|A| agrees with the "
                "closed form to 1e-4 on every group and the std normaliser raises the gradient share of the p = 1/8 "
                "and p = 7/8 groups (ratio > 1); not reproduced otherwise")


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE on the stored numbers."""
    from jaxrl_llm.reports.results import number

    agree = number(numbers, "max |measured - closed form| E|A|").mean < 1e-4
    raised = all(number(numbers, f"gradient share with / without std, p = {p}").mean > 1 for p in ("1/8", "7/8"))
    return "reproduced" if agree and raised else "not reproduced"


def main(argv: Sequence[str] | None = None) -> int:
    parser = experiment_parser(__doc__, name=NAME)
    parser.add_argument("--runs", nargs="*", default=None, help="run directories with groups.jsonl to measure")
    args = parser.parse_args(argv)
    out = output_dir(args, NAME)
    from jaxrl_llm.train.run.metrics import GROUPS_FILE, read_groups

    runs = [Path(r) for r in args.runs] if args.runs else []
    if not runs:
        sibling = Path("runs/experiments/length_bias") / ("quick" if args.quick else "full")
        runs = sorted(p.parent for p in sibling.glob(f"*/{GROUPS_FILE}")) if not args.overrides else []
    if not runs:
        runs = [train_or_resume(variant_config(get_config(), out, "grpo", QUICK, args.overrides, quick_on=args.quick))]
    records = [r for run in runs for r in read_groups(run)]
    sizes = {len(r["rewards"][0]) for r in records}
    if len(sizes) != 1:
        raise ValueError(f"the runs {[str(r) for r in runs]} have group sizes {sorted(sizes)}; valid: one group size")
    result = difficulty.measure(records)
    difficulty.plot(result, out / "difficulty_bias.png",
                    title=f"Difficulty bias on {len(result['success'])} real groups from {len(runs)} run(s)")
    rows = result["rows"]
    mid = min(rows, key=lambda r: abs(r["p"] - 0.5))
    edge = next((r for r in rows if 0 < r["p"] < 1), None)
    notes = [f"runs measured: {', '.join(str(r) for r in runs)} (their seeds pooled: the measured weights are an "
             f"identity on each logged group, so they carry no seed noise; the group counts do)",
             "analytic: E|A| = 2p(1-p) without std; 2p(1-p)/std with std, std = sqrt(G/(G-1) p(1-p)) (ddof=1). "
             "grad share: mean share of a step's total |dL/dlog pi| held by one group at that p, from the real loss "
             "(both with seq-mean-token-mean aggregation)."]
    if edge is not None:
        for short in ("analytic", "measured"):
            std = edge[f"{short} std"] / mid[f"{short} std"]
            no = edge[f"{short} no_std"] / mid[f"{short} no_std"]
            notes.append(f"{short}: weight at p={edge['p']:.3f} relative to p={mid['p']:.3f}: std {std:.3f}, "
                         f"no std {no:.3f} (std up-weights it {std / no:.2f}x)")
    write_summary(out, rows, list(rows[0]), title=f"Difficulty bias ({'quick' if args.quick else 'full'})",
                  notes=notes, config={"name": NAME, "quick": args.quick, "runs": [str(r) for r in runs]})
    print(f"wrote {out}/difficulty_bias.png, {out}/summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
