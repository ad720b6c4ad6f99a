"""Experiment 4: sanity check (Qi et al. 2025, arXiv 2510.26788): on a small
prompt set the model can learn, a correct RL pipeline drives the training
reward towards 1.0. Run it at each precision (learner and JAX sampler both
fp32, bf16 or fp16) and compare.

The set: the 71 training questions of 1-digit addition (the 29 others are held
out), which SmolLM2-135M-Instruct answers correctly 16% of the time at first
and learns within ~8 steps in float32 (`make demo`).

    python experiments/sanity_check.py --quick     # 3 precisions x 8 steps, seed 0, ~8 min on 2 CPU cores
    python experiments/sanity_check.py             # 3 precisions x 3 seeds x 20 steps
    jaxrl train --config experiments/sanity_check.py:bf16,gpu    # GPU scale, see experiments/README.md

Writes to runs/experiments/sanity_check/<quick|full>/: fp32_s0/, bf16_s0/, fp16_s0/, ..._s1/ (runs),
reward.png (first seed: reward, pass rate, mismatch k3 and grad norm over steps), seeds.png
(reward: mean, 95% band and points over seeds), summary.md / .json (means and 95% t-intervals
over seeds).
"""
from __future__ import annotations

from typing import Sequence

from base_configs import addition_config
from jaxrl_llm.reports import stats
from jaxrl_llm.reports.seed_curves import per_step_lengths, plot_seed_bands
from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment, window_mean, write_summary
from jaxrl_llm.train.config import Config, ConfigError

NAME = "sanity_check"
PRECISIONS = ("fp32", "bf16", "fp16")
QUICK = ("total_steps=8", "rollout.prompts_per_step=4")
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)


def get_config(arg: str = "fp32", seed: int = 0) -> Config:
    """ARG = "<precision>" (CPU) or "<precision>,gpu". Dr. GRPO; float32 master weights in
    every mode, the JAX sampler at the learner's precision."""
    precision, _, scale = arg.partition(",")
    if precision not in PRECISIONS:
        raise ConfigError(f"experiments/sanity_check.py:{arg} is invalid; valid: one of {PRECISIONS}, "
                          f"optionally followed by ',gpu'")
    return addition_config(f"{NAME}_{precision}", scale, recipe="dr_grpo", total_steps=20, max_tokens=12,
                           precision=precision, seed=seed)


def first_step_at(records: list[dict], key: str, threshold: float) -> int | None:
    return next((r["step"] for r in records if r.get(key, float("nan")) >= threshold), None)


def seed_row(records: list[dict]) -> dict:
    first = first_step_at(records, "reward", 0.9)
    return {"steps": len(records), "reward step 1": records[0]["reward"] if records else float("nan"),
            "reward last 2": window_mean(records, "reward", last=2),
            "max reward": max((r["reward"] for r in records), default=float("nan")),
            "first step >= 0.9": float("nan") if first is None else float(first),
            "mean mismatch k3": window_mean(records, "mismatch_k3"),
            "mean max|dp|": window_mean(records, "mismatch_prob_diff_max"),
            "skipped updates": sum(r.get("skipped", 0.0) for r in records),
            "s/step": window_mean(records, "time_step_s")}



# ------------------------------------------------------------- the verdict rule (issue 36)
CLAIM = "reward -> 1.0 on a learnable set, FP16 stable"
VERDICT_RULE = ("share of runs (every precision and seed) whose step reward reaches >= 0.9: reproduced if all do "
                "and no fp16 update was skipped, not reproduced if fewer than half do, otherwise inconclusive")


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE on the stored numbers."""
    from jaxrl_llm.reports.results import number

    share = number(numbers, "share of runs reaching reward >= 0.9").mean
    skipped = number(numbers, "fp16 updates skipped").mean
    if share < 0.5:
        return "not reproduced"
    return "reproduced" if share == 1.0 and skipped == 0 else "inconclusive"


def main(argv: Sequence[str] | None = None) -> int:
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS)).parse_args(argv)
    out = output_dir(args, NAME)
    from jaxrl_llm.train.run.metrics import read_groups, read_metrics
    from jaxrl_llm.train.run.plots import plot_runs

    done = run_seeded_experiment(args, out, PRECISIONS, get_config, QUICK)
    seeds, configs, runs = done.seeds, done.configs, done.runs
    plot_runs([runs[(p, seeds[0])] for p in PRECISIONS], ["reward", "pass_rate", "mismatch_k3", "grad_norm",
                                                          "entropy", "skipped"], out / "reward.png",
              title=f"Sanity check: training reward by precision (seed {seeds[0]})")
    plot_seed_bands({p: [per_step_lengths(read_groups(runs[(p, s)])) for s in seeds] for p in PRECISIONS},
                    ("reward",), out / "seeds.png", title=f"Sanity check: {len(seeds)} seed(s) per precision",
                    limits={"reward": (0.0, 1.0)})
    rows = []
    for precision in PRECISIONS:
        per_seed = [seed_row(read_metrics(runs[(precision, s)])) for s in seeds]
        row = {"precision": precision, "seeds": len(seeds)}
        for key in per_seed[0]:
            iv = stats.interval([p[key] for p in per_seed])
            row[key] = stats.format_interval(iv)
            row[f"{key} interval"] = iv.to_dict()
        row["per seed"] = per_seed
        rows.append(row)
    columns = ["precision", "seeds", *seed_row([]).keys()]
    write_summary(out, rows, columns, title=f"Sanity check ({'quick' if args.quick else 'full'})",
                  notes=[stats.seed_note(seeds, quick=args.quick, full_seeds=len(SEEDS)),
                         "mismatch: JAX sampler (at the run's precision) vs the learner's pi_old, logged every step."],
                  config={"name": NAME, "quick": args.quick, "seeds": list(seeds),
                          "variants": {f"{p}_s{s}": c.to_dict() for (p, s), c in configs.items()}})
    print(f"wrote {out}/reward.png, seeds.png, {out}/summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
