"""Experiment 4: sanity check (Qi et al. 2025, arXiv 2510.26788): on a small
prompt set the model can learn, a correct RL pipeline drives the training
reward towards 1.0. Run it at each precision (learner and JAX sampler both
fp32, bf16 or fp16) and compare.

The set: the 71 training questions of 1-digit addition (the 29 others are held
out), which SmolLM2-135M-Instruct answers correctly 16% of the time at first
and learns within ~8 steps in float32 (`make demo`).

    python experiments/sanity_check.py --quick     # 3 precisions x 8 steps, ~12 min on 2 CPU cores
    python experiments/sanity_check.py             # 3 x 20 steps
    jaxrl train --config experiments/sanity_check.py:bf16,gpu    # GPU scale, see experiments/README.md

Writes to runs/experiments/sanity_check/<quick|full>/: fp32/, bf16/, fp16/ (runs),
reward.png (reward, pass rate, mismatch k3 and grad norm over steps), summary.md / .json.
"""
from __future__ import annotations

from typing import Sequence

from base_configs import addition_config
from jaxrl_llm.reports.runs import (
    experiment_parser,
    output_dir,
    train_or_resume,
    variant_config,
    window_mean,
    write_summary,
)
from jaxrl_llm.train.config import Config, ConfigError

NAME = "sanity_check"
PRECISIONS = ("fp32", "bf16", "fp16")
QUICK = ("total_steps=8", "rollout.prompts_per_step=4")


def get_config(arg: str = "fp32") -> Config:
    """ARG = "<precision>" (CPU) or "<precision>,gpu". Dr. GRPO; float32 master weights in
    every mode, the JAX sampler at the learner's precision."""
    precision, _, scale = arg.partition(",")
    if precision not in PRECISIONS:
        raise ConfigError(f"experiments/sanity_check.py:{arg} is invalid; valid: one of {PRECISIONS}, "
                          f"optionally followed by ',gpu'")
    return addition_config(f"{NAME}_{precision}", scale, recipe="dr_grpo", total_steps=20, max_tokens=12,
                           precision=precision)


def first_step_at(records: list[dict], key: str, threshold: float) -> int | None:
    return next((r["step"] for r in records if r.get(key, float("nan")) >= threshold), None)


def main(argv: Sequence[str] | None = None) -> int:
    args = experiment_parser(__doc__, name=NAME).parse_args(argv)
    out = output_dir(args, NAME)
    from jaxrl_llm.train.policy import load_policy
    from jaxrl_llm.train.metrics import read_metrics
    from jaxrl_llm.train.plots import plot_runs

    configs = [variant_config(get_config(p), out, p, QUICK, args.overrides, quick_on=args.quick) for p in PRECISIONS]
    policy = load_policy(configs[0].model.source)
    runs = [train_or_resume(cfg, policy=policy) for cfg in configs]
    plot_runs(runs, ["reward", "pass_rate", "mismatch_k3", "grad_norm", "entropy", "skipped"], out / "reward.png",
              title="Sanity check: training reward by precision")
    rows = []
    for precision, run in zip(PRECISIONS, runs):
        records = read_metrics(run)
        rows.append({"precision": precision, "steps": len(records),
                     "reward step 1": records[0]["reward"] if records else float("nan"),
                     "reward last 2": window_mean(records, "reward", last=2),
                     "max reward": max((r["reward"] for r in records), default=float("nan")),
                     "first step >= 0.9": first_step_at(records, "reward", 0.9) or "-",
                     "mean mismatch k3": window_mean(records, "mismatch_k3"),
                     "mean max|dp|": window_mean(records, "mismatch_prob_diff_max"),
                     "skipped updates": sum(r.get("skipped", 0.0) for r in records),
                     "s/step": window_mean(records, "time_step_s")})
    write_summary(out, rows, list(rows[0]), title=f"Sanity check ({'quick' if args.quick else 'full'})",
                  notes=["mismatch: JAX sampler (at the run's precision) vs the learner's pi_old, logged every step."],
                  config={"name": NAME, "quick": args.quick, "variants": {p: c.to_dict() for p, c in
                                                                           zip(PRECISIONS, configs)}})
    print(f"wrote {out}/reward.png, {out}/summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
