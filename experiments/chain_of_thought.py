"""Experiment 7: the chain-of-thought setting, GRPO vs Dr. GRPO.

The setting of long-reasoning RL (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783): a
"think step by step" prompt, the answer in \\boxed{} graded by reasoning-gym's verifier,
generations of 1k+ tokens where wrong answers are long failed reasoning chains: the
setting in which the paper saw incorrect responses grow under GRPO. At GPU scale:
Qwen2.5-Math-1.5B on `cot_gsm_symbolic` (GSM-Symbolic word problems), 2048 tokens. On
a CPU the same code path runs SmolLM2-135M-Instruct on `cot_chain_sum` (sums of 2-3
small numbers) with short generations: a check that the path works, not a result.

    python experiments/chain_of_thought.py --quick      # CPU: 2 recipes x 1 seed x 2 steps of 2 x 4, 64 tokens
    python experiments/chain_of_thought.py              # CPU: 2 recipes x 3 seeds x 10 steps of 4 x 8, 256 tokens
    python launch/single_node.py --config experiments/chain_of_thought.py:grpo,gpu ...   # launch/README.md

Writes to runs/experiments/chain_of_thought/<quick|full>/: <recipe>_s<seed>/ (runs),
lengths.png (reward and mean length of correct / incorrect responses: mean, 95% band and
points over seeds), summary.md / .json.
"""
from __future__ import annotations

from typing import Sequence

from base_configs import addition_config, gpu_scale
from jaxrl_llm.reports import stats
from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment, write_summary
from jaxrl_llm.reports.seed_curves import change, per_step_lengths, plot_seed_bands, reward_length_limits
from jaxrl_llm.train.config import Config, ConfigError, replace_values

NAME = "chain_of_thought"
RECIPES = ("grpo", "dr_grpo")
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)
QUICK = ("total_steps=2", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_tokens=64",
         "train.micro_batch_size=8")
GPU_MAX_TOKENS = 2048


def get_config(arg: str = "grpo", seed: int = 0) -> Config:
    """ARG = "<recipe>" (CPU: SmolLM2 on cot_chain_sum) or "<recipe>,gpu" (Qwen2.5-Math-1.5B-class
    model on cot_gsm_symbolic, 2048 tokens; model.source=DIR or single_node.py --model-dir)."""
    recipe, _, scale = arg.partition(",")
    if recipe not in RECIPES:
        raise ConfigError(f"experiments/chain_of_thought.py:{arg} is invalid; valid: one of {RECIPES}, "
                          f"optionally followed by ',gpu'")
    cfg = addition_config(f"{NAME}_{recipe}", recipe=recipe, total_steps=10, max_tokens=256, seed=seed)
    cfg = replace_values(cfg, {"task.name": "cot_chain_sum", "rollout.prompts_per_step": 4})
    if scale == "gpu":
        cfg = gpu_scale(cfg, name=f"{NAME}_{recipe}")
        cfg = replace_values(cfg, {"task.name": "cot_gsm_symbolic", "task.jsonl_path": None,
                                   "rollout.max_tokens": GPU_MAX_TOKENS})
    elif scale:
        raise ConfigError(f"experiments/chain_of_thought.py:{arg}: scale {scale!r} is invalid; valid: none or 'gpu'")
    return cfg



# ------------------------------------------------------------- the verdict rule (issue 36)
CLAIM = "wrong answers grow under GRPO in long reasoning (Liu et al. 2025, arXiv 2503.20783)"
VERDICT_RULE = ("no verdict on a CPU: the GPU-scale config was never run; the CPU run is a code-path check "
                "(reward 0 in every sample, so no gradient)")


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE: a code-path check gives no verdict."""
    return "no verdict"


def main(argv: Sequence[str] | None = None) -> int:
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS)).parse_args(argv)
    out = output_dir(args, NAME)
    from jaxrl_llm.train.run.metrics import read_groups, read_metrics

    done = run_seeded_experiment(args, out, RECIPES, get_config, QUICK)
    seeds, configs, runs = done.seeds, done.configs, done.runs
    curves = done.per_variant(lambda run: per_step_lengths(read_groups(run)))
    rows = []
    for r, seed_curves in curves.items():
        per_seed = [{"reward first": c["reward"][0], "reward last": c["reward"][-1],
                     "d length_correct": change(c["length_correct"]),
                     "d length_incorrect": change(c["length_incorrect"]),
                     "truncated": stats.interval([m.get("truncated_fraction", float("nan"))
                                                  for m in read_metrics(runs[(r, s)])]).mean}
                    for c, s in zip(seed_curves, seeds)]
        row = {"recipe": r}
        for key in per_seed[0]:
            iv = stats.interval([p[key] for p in per_seed])
            row[key] = stats.format_interval(iv, signed=key.startswith("d "))
            row[f"{key} interval"] = iv.to_dict()
        row["per seed"] = per_seed
        rows.append(row)
    write_summary(out, rows, ["recipe", "reward first", "reward last", "d length_correct", "d length_incorrect",
                              "truncated"], title=f"Chain of thought ({'quick' if args.quick else 'full'})",
                  notes=[stats.seed_note(seeds, quick=args.quick, full_seeds=len(SEEDS)),
                         "CPU scale: a check of the code path (SmolLM2, short generations), not a result."],
                  config={"name": NAME, "quick": args.quick, "seeds": list(seeds),
                          "variants": {f"{r}_s{s}": c.to_dict() for (r, s), c in configs.items()}})
    plot_seed_bands(curves, ("reward", "length_correct", "length_incorrect"), out / "lengths.png",
                    title=f"Chain of thought: {len(seeds)} seed(s) per recipe",
                    limits=reward_length_limits(next(iter(configs.values())).rollout.max_tokens))
    print(f"wrote {out}/lengths.png, {out}/summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
