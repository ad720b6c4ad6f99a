"""Experiment 4: sanity check (Qi et al. 2025, arXiv 2510.26788): on a small
prompt set the model can learn, a correct RL pipeline drives the training
reward towards 1.0. Run it at each precision (learner and JAX sampler both
fp32, bf16 or fp16) and compare.

The set: the 71 training questions of 1-digit addition (the 29 others are held
out), which SmolLM2-135M-Instruct answers correctly 16% of the time at first
and learns within ~8 steps in float32 (`make demo`).

    python experiments/sanity_check.py --results experiments/results/sanity_check.json   # the deciding run
    python experiments/sanity_check.py --quick     # 3 precisions x 8 steps, seed 501, ~8 min on 2 CPU cores
    python experiments/sanity_check.py             # 3 precisions x 3 seeds x 20 steps
    jaxrl train --config experiments/sanity_check.py:bf16,gpu    # GPU scale, see experiments/README.md

Writes to runs/experiments/sanity_check/<quick|full>/: fp32_s501/, bf16_s501/, fp16_s501/, ..._s502/ (runs),
reward.png (first seed: reward, pass rate, mismatch k3 and grad norm over steps), seeds.png
(reward: mean, 95% band and points over seeds), summary.md / .json (means and 95% t-intervals
over seeds).
"""
from __future__ import annotations

import math
import shlex
import sys
import time
from typing import Mapping, Sequence

from base_configs import addition_config
from jaxrl_llm.reports import stats
from jaxrl_llm.reports.seed_curves import per_step_lengths, plot_seed_bands
from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment, window_mean, write_summary
from jaxrl_llm.train.config import Config, ConfigError

NAME = "sanity_check"
PRECISIONS = ("fp32", "bf16", "fp16")
QUICK = ("total_steps=8", "rollout.prompts_per_step=4")
SEEDS, QUICK_SEEDS = (501, 502, 503), (501,)  # fresh (issue 51): seeds 0-2 ran before this rule was fixed


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



# ------------------------------------------------------------- the verdict rule (issues 36, 51; fixed before the run)
CLAIM = "reward -> 1.0 on a learnable set, FP16 stable"
MIN_SEEDS = 3
THRESHOLD = 0.9
SHARE_KEY, SKIPPED_KEY = f"share of runs reaching reward >= {THRESHOLD:g}", "fp16 updates skipped"
VERDICT_RULE = (f"share of runs (every precision and seed) whose step reward reaches >= {THRESHOLD:g}: reproduced if "
                "all do and no fp16 update was skipped, not reproduced if fewer than half do, otherwise inconclusive; "
                f"inconclusive (not measured) with fewer than {MIN_SEEDS} seeds of each precision")


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored numbers."""
    from jaxrl_llm.reports.results import number

    if min(number(numbers, f"{p} reward, last 5 steps").n for p in PRECISIONS) < MIN_SEEDS:
        return "inconclusive"
    share, skipped = number(numbers, SHARE_KEY).mean, number(numbers, SKIPPED_KEY).mean
    if share < 0.5:
        return "not reproduced"
    return "reproduced" if share == 1.0 and skipped == 0 else "inconclusive"


def deciding_result(per_run: Mapping[tuple[str, int], list[dict]], *, setting: str, command: str, wall_s: float,
                    notes: Sequence[str] = ()):
    """The stored result of {(precision, seed): metrics records}: VERDICT_RULE on every run."""
    from jaxrl_llm.reports.results import ExperimentResult, interval_of, keyed

    reached = {run: first_step_at(records, "reward", THRESHOLD) is not None for run, records in per_run.items()}
    seeds = sorted({s for _, s in per_run})
    nan = math.nan
    stored = {f"{p} reward, last 5 steps": keyed({s: window_mean(per_run[(p, s)], "reward", last=5)
                                                   for s in seeds if (p, s) in per_run}) for p in PRECISIONS}
    stored |= {f"{p} first step >= {THRESHOLD:g}": keyed({s: first_step_at(per_run[(p, s)], "reward", THRESHOLD) or nan
                                                          for s in seeds if (p, s) in per_run}) for p in PRECISIONS}
    numbers = {k: interval_of(v).to_dict() for k, v in stored.items()}
    numbers[SHARE_KEY] = {"mean": sum(reached.values()) / len(reached), "low": nan, "high": nan, "n": len(reached)}
    fp16 = [run for run in per_run if run[0] == "fp16"]
    numbers[SKIPPED_KEY] = {"mean": float(sum(r.get("skipped", 0.0) for run in fp16 for r in per_run[run])),
                            "low": nan, "high": nan, "n": len(fp16)}
    return ExperimentResult(
        name=NAME, title="sanity check (fp32 / bf16 / fp16)", claim=CLAIM, setting=setting, command=command,
        seeds=tuple(seeds), statistic=f"share of runs whose step reward reaches >= {THRESHOLD:g}; mean reward of the "
        "last 5 steps and the first step at the threshold per precision", interval_method="mean and 95% Student-t "
        "over seeds", verdict_rule=VERDICT_RULE, verdict=rule_verdict(numbers), headline=SHARE_KEY, numbers=numbers,
        per_seed=stored, wall_s=wall_s, notes=tuple(notes))


def main(argv: Sequence[str] | None = None) -> int:
    import os

    start, load_start = time.perf_counter(), os.getloadavg()
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True).parse_args(argv)
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
    if args.results:
        from jaxrl_llm.reports.results import write_result

        cfg = configs[(PRECISIONS[0], seeds[0])]
        setting = (f"{'--quick: ' if args.quick else ''}{cfg.task.name}, {cfg.total_steps} steps x "
                   f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.samples_per_prompt} samples, max "
                   f"{cfg.rollout.max_tokens} tokens, {cfg.recipe.name}, lr {cfg.train.lr}, {cfg.rollout.engine} "
                   f"sampler at the learner's precision, SmolLM2-135M; precisions {', '.join(PRECISIONS)}")
        command = "python experiments/sanity_check.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        result = deciding_result({run: read_metrics(path) for run, path in runs.items()}, setting=setting,
                                 command=command, wall_s=time.perf_counter() - start,
                                 notes=[f"load average at the start: {[round(x, 2) for x in load_start]}"])
        print(f"[experiment] wrote {write_result(result, args.results)}: {result.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
