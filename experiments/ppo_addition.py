"""PPO with a learned critic (value head on the trunk, GAE) on 1-digit addition: held-out
pass@1 before and after a short run.

Question: does `recipe.name=ppo` (Schulman et al. 2017; GAE, Schulman et al. 2016; the
critic of train/learn/critic.py) raise SmolLM2-135M-Instruct's held-out pass@1 on 1-digit
addition within a few steps on a CPU?

    python experiments/ppo_addition.py --quick    # 4 prompts x 4 samples, 8 steps
    python experiments/ppo_addition.py            # 8 prompts x 4 samples, 10 steps

Both evaluations use the same engine (the JAX sampler, float32), the same held-out
questions (all 29 of the split), the same seed and temperature 1. Writes
runs/experiments/ppo_addition/<quick|full>/: summary.json, summary.md and the run's
metrics.jsonl (value_loss, explained_variance, value_mean, return_mean per step).
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from base_configs import addition_config  # noqa: E402

from jaxrl_llm.reports.runs import experiment_parser, output_dir, variant_config  # noqa: E402

NAME = "ppo_addition"
EVAL_SEED = 12345
FULL = ["rollout.prompts_per_step=8", "rollout.samples_per_prompt=4"]
QUICK = ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=4", "total_steps=8"]


def get_config():
    """SmolLM2 on 1-digit addition (experiments/base_configs.py) with recipe ppo: lr 2e-5
    for the policy, 1e-3 for the value head (zero-initialised), 1 critic-only warm-up
    optimiser step so the advantages do not all come from V = 0, answers of <= 8 tokens,
    held-out pass@1 over 4 samples per question."""
    from jaxrl_llm.train.config import replace_values

    cfg = addition_config(NAME, recipe="ppo", total_steps=10, max_tokens=8)
    return replace_values(cfg, {"critic.lr": 1e-3, "critic.warmup_steps": 1, "task.eval_samples": 4,
                                "train.micro_batch_size": 16, "checkpoint.every_steps": 0})


def run(cfg) -> dict:
    """Held-out pass@1 before, `cfg.total_steps` PPO steps, pass@1 after (one engine)."""
    from jaxrl_llm.train.sample.engines import engine_spec, make_engine
    from jaxrl_llm.train.run.evaluation import evaluate, held_out
    from jaxrl_llm.train.run.loop import train
    from jaxrl_llm.train.run.metrics import read_metrics
    from jaxrl_llm.train.policy import load_policy
    from jaxrl_llm.train.sample.prompts import task_from_config

    start = time.perf_counter()
    policy = load_policy(cfg.model.source)
    task = task_from_config(cfg)
    samples = cfg.task.eval_samples
    with contextlib.ExitStack() as stack:
        engine = make_engine(engine_spec(cfg), policy, policy.params, stack=stack)
        before = evaluate(engine, policy, task, held_out(cfg), samples=samples, seed=EVAL_SEED)
        print(f"[ppo_addition] held-out pass@1 before {before['pass@1']:.3f}", flush=True)
        train(cfg, task=task, policy=policy, engine=engine)
        after = evaluate(engine, policy, task, held_out(cfg), samples=samples, seed=EVAL_SEED)
    rows = read_metrics(cfg.run_path)
    per_step = [{k: r.get(k) for k in ("step", "reward", "pass_rate", "value_loss", "explained_variance",
                                       "value_mean", "return_mean")} for r in rows]
    return {"before_pass@1": before["pass@1"], "after_pass@1": after["pass@1"],
            "questions": before["num_prompts"], "samples": samples, "steps": cfg.total_steps,
            "per_step": per_step, "wall_s": time.perf_counter() - start}


def main(argv: Sequence[str] | None = None) -> int:
    args = experiment_parser(__doc__, name=NAME).parse_args(argv)
    out = output_dir(args, NAME)
    cfg = variant_config(get_config(), out, "ppo", QUICK, [*FULL, *args.overrides] if not args.quick else
                         args.overrides, quick_on=args.quick)
    result = run(cfg)
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# PPO critic on 1-digit addition ({'quick' if args.quick else 'full'})", "",
             f"held-out pass@1: {result['before_pass@1']:.3f} -> {result['after_pass@1']:.3f} "
             f"({result['questions']} questions x {result['samples']} samples, seed {EVAL_SEED})", "",
             "| step | reward | pass_rate | value_loss | explained_variance | value_mean | return_mean |",
             "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in r) + " |"
              for r in result["per_step"]]
    lines.append(f"\nwall {result['wall_s'] / 60:.1f} min")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
