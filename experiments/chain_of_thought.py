"""Experiment 7: the chain-of-thought setting, GRPO vs Dr. GRPO.

The setting of long-reasoning RL (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783): a
"think step by step" prompt, the answer in \\boxed{} graded by reasoning-gym's verifier,
generations of 1k+ tokens where wrong answers are long failed reasoning chains: the
setting in which the paper saw incorrect responses grow under GRPO. At GPU scale:
Qwen2.5-Math-1.5B on `cot_gsm_symbolic` (GSM-Symbolic word problems), 2048 tokens. On
a CPU the same code path runs SmolLM2-135M-Instruct on `cot_chain_sum` (sums of 2-3
small numbers) with short generations: a check that the path works, not a result.

    python experiments/chain_of_thought.py --quick --seeds 301,302,303 --results experiments/results/chain_of_thought.json
    python experiments/chain_of_thought.py --quick      # CPU: 2 recipes x 1 seed x 2 steps of 2 x 4, 64 tokens
    python experiments/chain_of_thought.py              # CPU: 2 recipes x 3 seeds x 10 steps of 4 x 8, 256 tokens
    python launch/single_node.py --config experiments/chain_of_thought.py:grpo,gpu ...   # launch/README.md

Writes to runs/experiments/chain_of_thought/<quick|full>/: <recipe>_s<seed>/ (runs),
lengths.png (reward and mean length of correct / incorrect responses: mean, 95% band and
points over seeds), summary.md / .json.
"""
from __future__ import annotations

import math
import shlex
import sys
import time
from typing import Mapping, Sequence

import numpy as np

from base_configs import addition_config, gpu_scale
from jaxrl_llm.reports import stats
from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment, write_summary
from jaxrl_llm.reports.seed_curves import change, per_step_lengths, plot_seed_bands, reward_length_limits
from jaxrl_llm.train.config import Config, ConfigError, replace_values

NAME = "chain_of_thought"
RECIPES = ("grpo", "dr_grpo")
SEEDS, QUICK_SEEDS = (301, 302, 303), (301,)  # fresh (issue 51): the recorded code-path check used seed 0
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



# ------------------------------------------------------------- the verdict rule (issue 51, fixed before the run)
CLAIM = "wrong answers grow under GRPO in long reasoning (Liu et al. 2025, arXiv 2503.20783)"
MIN_SEEDS = 3
MARGIN_SHARE = 0.05  # the equivalence margin: 5% of rollout.max_tokens, fixed before the run
DIFF_KEY = "grpo - dr_grpo d length_incorrect"
SIGNAL_KEY = "seeds with a learning signal"
MARGIN_KEY = "equivalence margin (tokens)"
EXCLUSION_RULE = ("a seed counts only when both recipes' runs had at least one group whose rewards differ (a group of "
                  "equal rewards has advantage 0 and gives no gradient: a run without one never learned, and its "
                  "length change is sampling noise, not measured)")
VERDICT_RULE = (
    "per counted seed: paired GRPO - Dr. GRPO change (last minus first window) in the mean length of incorrect "
    f"responses, 95% Student-t over seeds. Not measured (inconclusive) with fewer than {MIN_SEEDS} counted seeds. "
    "reproduced if the interval lies above 0; not reproduced if it lies below 0 or inside +-margin "
    f"(margin = {MARGIN_SHARE:g} x rollout.max_tokens, fixed before the run: no effect); inconclusive otherwise")


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored numbers (reports.results.number)."""
    from jaxrl_llm.reports.results import number

    diff, margin = number(numbers, DIFF_KEY), number(numbers, MARGIN_KEY).mean
    if number(numbers, SIGNAL_KEY).mean < MIN_SEEDS or diff.n < MIN_SEEDS:
        return "inconclusive"
    if diff.low > 0:
        return "reproduced"
    if diff.high < 0 or (-margin < diff.low and diff.high < margin):
        return "not reproduced"
    return "inconclusive"


def informative_groups(groups: Sequence[Mapping]) -> int:
    """How many of a run's logged groups (all steps) have rewards that differ: the groups with a gradient."""
    return int(sum((np.ptp(np.asarray(row, float)) > 0) for g in groups for row in g["rewards"]))


def seed_row(groups: Sequence[Mapping]) -> dict[str, float]:
    """One run's numbers: reward, share of correct answers, informative groups, and the changes
    (last minus first step) of the mean correct / incorrect length."""
    curve = per_step_lengths(groups)
    return {"reward first": curve["reward"][0], "reward last": curve["reward"][-1],
            "informative groups": float(informative_groups(groups)),
            "d length_correct": change(curve["length_correct"]),
            "d length_incorrect": change(curve["length_incorrect"])}


def deciding_result(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]], *, max_tokens: int, setting: str,
                    command: str, wall_s: float, notes: Sequence[str] = ()):
    """The stored result of {seed: {recipe: seed_row(...)}}: EXCLUSION_RULE, then VERDICT_RULE."""
    from jaxrl_llm.reports.results import ExperimentResult, interval_of, keyed

    counted = {s: rows for s, rows in per_seed.items()
               if all(rows[r]["informative groups"] > 0 for r in RECIPES)}
    excluded = {str(s): "no learning signal: " + ", ".join(r for r in RECIPES if rows[r]["informative groups"] == 0)
                + " saw no group with differing rewards" for s, rows in per_seed.items() if s not in counted}
    stored = {DIFF_KEY: keyed({s: rows["grpo"]["d length_incorrect"] - rows["dr_grpo"]["d length_incorrect"]
                               for s, rows in counted.items()})}
    for r in RECIPES:
        for key in next(iter(per_seed.values()))[r]:
            stored[f"{r} {key}"] = keyed({s: rows[r][key] for s, rows in per_seed.items()})
    numbers = {k: interval_of(v).to_dict() for k, v in stored.items()}
    nan = math.nan
    numbers[SIGNAL_KEY] = {"mean": float(len(counted)), "low": nan, "high": nan, "n": len(per_seed)}
    numbers[MARGIN_KEY] = {"mean": MARGIN_SHARE * max_tokens, "low": nan, "high": nan, "n": 1}
    verdict = rule_verdict(numbers)
    return ExperimentResult(
        name=NAME, title="chain-of-thought setting (SmolLM2-135M on cot_chain_sum, CPU scale)", claim=CLAIM,
        setting=setting, command=command, seeds=tuple(counted), statistic="paired GRPO - Dr. GRPO change in mean "
        "incorrect length (last minus first step), on the seeds with a learning signal",
        interval_method="mean and 95% Student-t over seeds, paired by seed", verdict_rule=VERDICT_RULE,
        exclusion_rule=EXCLUSION_RULE, excluded=excluded, verdict=verdict,
        headline=DIFF_KEY if len(counted) >= MIN_SEEDS else SIGNAL_KEY, numbers=numbers, per_seed=stored,
        wall_s=wall_s, notes=tuple(notes))


def main(argv: Sequence[str] | None = None) -> int:
    import os

    start, load_start = time.perf_counter(), os.getloadavg()
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True).parse_args(argv)
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
    if args.results:
        from jaxrl_llm.reports.results import write_result

        cfg = configs[(RECIPES[0], seeds[0])]
        setting = (f"{'--quick: ' if args.quick else ''}{cfg.task.name}, {cfg.total_steps} steps x "
                   f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.samples_per_prompt} samples, max "
                   f"{cfg.rollout.max_tokens} tokens, lr {cfg.train.lr}, {cfg.train.precision}, {cfg.rollout.engine} "
                   f"sampler, SmolLM2-135M; recipes {', '.join(RECIPES)}")
        per_seed = {s: {r: seed_row(read_groups(runs[(r, s)])) for r in RECIPES} for s in seeds}
        command = "python experiments/chain_of_thought.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        result = deciding_result(per_seed, max_tokens=cfg.rollout.max_tokens, setting=setting, command=command,
                                 wall_s=time.perf_counter() - start,
                                 notes=[f"load average at the start: {[round(x, 2) for x in load_start]}"])
        print(f"[experiment] wrote {write_result(result, args.results)}: {result.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
