"""Experiment 1: length bias. GRPO vs Dr. GRPO vs DAPO from the same seed.

Question (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1 and Fig. 5):
GRPO divides each response's loss by its length (seq-mean-token-mean), so a
long wrong answer is penalised less per token than a short one. Do incorrect
responses grow longer under GRPO than under Dr. GRPO (group-mean advantage,
constant normaliser) and DAPO (token-mean), while the reward is similar?

    python experiments/length_bias.py --quick     # 3 runs x 8 steps, seed 0 only, ~12 min on 2 CPU cores
    python experiments/length_bias.py             # CPU full size: 3 recipes x 3 seeds x 16 steps of 8 x 8, ~3 h
    python experiments/length_bias.py --quick --recipes grpo,dr_grpo --seeds 10,11,12,13 \\
        --out runs/experiments/length_bias/deciding --results experiments/results/length_bias.json
                                                  # issue 36's deciding run: paired GRPO - Dr. GRPO (EARLIER_RULE)
    python experiments/length_bias.py --quick --recipes grpo,dr_grpo --seeds 20,21,...,37 \\
        --out runs/experiments/length_bias/powered --results experiments/results/length_bias.json
                                                  # the powered run (POWERED_RULE, the stored result's);
                                                  # subsets of its seeds may run first without --results
    jaxrl train --config experiments/length_bias.py:grpo        # one variant alone
    jaxrl train --config experiments/length_bias.py:grpo,gpu    # GPU scale (experiments/README.md)

Writes to runs/experiments/length_bias/<quick|full>/:
  grpo_s0/, dr_grpo_s0/, dapo_s0/, ..._s1/ ...   the runs (metrics.jsonl, groups.jsonl, run_info.json,
                            checkpoints), one per recipe and seed
  training.png              seed 0: reward, lengths, truncation, entropy over steps
  seeds.png                 reward and mean length of correct / incorrect responses: mean, 95% band
                            and points over seeds
  analytic/length_bias.png  implied per-token weight against length for each recipe, computed
                            by differentiating each recipe's loss on the GRPO run's real groups
  summary.md / .json        the numbers of experiments/README.md
"""
from __future__ import annotations

import shlex
import sys
import time
from typing import Sequence

import numpy as np

from base_configs import addition_config
from jaxrl_llm.reports import bias_report, stats
from jaxrl_llm.reports.seed_curves import per_step_lengths, plot_seed_bands, reward_length_limits
from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment, window_mean, write_summary
from jaxrl_llm.train.config import Config, replace_values

NAME = "length_bias"
RECIPES = ("grpo", "dr_grpo", "dapo")
# The --quick size: half the prompts per step, half the steps, one seed.
QUICK = ("total_steps=8", "rollout.prompts_per_step=4")
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)

# ------------------------------------------- the deciding run: fixed before it ran (issue 36)
# The claim is comparative, so the statistic is the paired GRPO - Dr. GRPO difference of the
# change in incorrect-response length, seed by seed (same seed = same prompts and first samples).
# Seeds 0-2 ran the earlier sizes; the deciding run (the --quick size, GRPO and Dr. GRPO only)
# uses fresh seeds. No setting was tuned on any seed; no exclusion rule (every seed counts).
DECIDING_SEEDS = (10, 11, 12, 13)
CLAIM = "incorrect responses grow longer under GRPO than under Dr. GRPO (Liu et al. 2025, arXiv 2503.20783)"
STATISTIC = ("paired GRPO - Dr. GRPO difference of the change in mean incorrect-response length "
             "(last 3 steps minus first 3, pooled over their responses), per seed")
EARLIER_RULE = ("95% Student-t interval of the paired difference over seeds: reproduced if it lies above 0, "
                 "not reproduced if it lies below 0, otherwise inconclusive (also with one seed)")


# ------------------------------------------- the powered run: fixed before it ran (issue 51)
# The run above (seeds 10-13) measured the paired difference's spread: sd 4.22 tokens. The claim
# is called here a length bias of at least PLANNED_EFFECT tokens (~10% of the 32-token cap, the
# size of the per-seed differences seen); 80% power for it with a two-sided 95% paired t-test
# needs POWERED_SEED_COUNT seeds (stats.seeds_for_power: 18; 11 for 4 tokens, 8 for 5). Fresh
# seeds 20-37, the same --quick size, GRPO and Dr. GRPO only; the runs may span several sessions
# (a rerun of the command keeps finished runs), from the commit that fixed this rule.
MEASURED_SD = 4.22  # sd of the paired GRPO - Dr. GRPO difference over seeds 10-13 (experiments/results)
PLANNED_EFFECT = 3.0  # tokens
POWERED_SEED_COUNT = stats.seeds_for_power(PLANNED_EFFECT, MEASURED_SD)
POWERED_SEEDS = tuple(range(20, 20 + POWERED_SEED_COUNT))
POWERED_RULE = (f"Seeds {POWERED_SEEDS[0]}-{POWERED_SEEDS[-1]} ({POWERED_SEED_COUNT}: 80% power at a paired "
                f"difference of {PLANNED_EFFECT:g} tokens with the sd {MEASURED_SD} measured on seeds 10-13), fresh; "
                "a seed counts when both its runs finished; fewer counted seeds than planned: inconclusive. 95% "
                "Student-t interval of the paired GRPO - Dr. GRPO change in incorrect length: reproduced if it lies "
                f"above 0; not reproduced if it lies below 0 or inside +-{PLANNED_EFFECT:g} tokens (no length bias as "
                "large as the one the run was powered for); otherwise inconclusive")


VERDICT_RULE = POWERED_RULE  # the stored result's rule (experiments/results/length_bias.json)


def powered_verdict(diff: stats.Interval) -> str:
    """POWERED_RULE on the paired GRPO - Dr. GRPO interval."""
    if diff.n < POWERED_SEED_COUNT or not np.isfinite(diff.low):
        return "inconclusive"
    if diff.low > 0:
        return "reproduced"
    if diff.high < 0 or (-PLANNED_EFFECT < diff.low and diff.high < PLANNED_EFFECT):
        return "not reproduced"
    return "inconclusive"


def verdict(diff: stats.Interval) -> str:
    """EARLIER_RULE on the paired GRPO - Dr. GRPO interval."""
    if diff.n < 2 or not diff.excludes_zero():
        return "inconclusive"
    return "reproduced" if diff.low > 0 else "not reproduced"


def deciding_result(per_seed: dict[str, list[dict]], seeds: Sequence[int], *, setting: str, command: str,
                    wall_s: float | None, powered: bool = False):
    """The stored result (reports/results.py): EARLIER_RULE (POWERED_RULE if `powered`) on the paired
    difference."""
    from jaxrl_llm.reports.results import ExperimentResult, keyed, paired

    by_seed = {r: {s: row for s, row in zip(seeds, rows)} for r, rows in per_seed.items()}
    per = {f"{r} {k}": keyed({s: by_seed[r][s][k] for s in seeds}) for r in by_seed
           for k in ("d length_incorrect", "d length_correct", "reward last")}
    numbers = {}
    for k in ("d length_incorrect", "d length_correct"):
        diff = paired({s: by_seed["grpo"][s][k] for s in seeds}, {s: by_seed["dr_grpo"][s][k] for s in seeds})
        per[f"grpo - dr_grpo {k}"] = keyed(diff)
        numbers[f"grpo - dr_grpo {k}"] = stats.interval(list(diff.values())).to_dict()
    for r in by_seed:
        numbers[f"{r} d length_incorrect"] = stats.interval(list(per[f"{r} d length_incorrect"].values())).to_dict()
    return ExperimentResult(
        name=NAME, title="length bias, length-dependent reward (SmolLM2-135M, 1-digit addition)", claim=CLAIM,
        setting=setting, command=command, seeds=tuple(seeds), statistic=STATISTIC,
        interval_method="mean and 95% Student-t over seeds, paired by seed",
        verdict_rule=POWERED_RULE if powered else EARLIER_RULE,
        verdict=(powered_verdict if powered else verdict)(
            stats.Interval(**numbers["grpo - dr_grpo d length_incorrect"])),
        headline="grpo - dr_grpo d length_incorrect", numbers=numbers, per_seed=per, wall_s=wall_s)


def get_config(arg: str = "grpo", seed: int = 0) -> Config:
    """ARG = "<recipe>" (CPU) or "<recipe>,gpu" (GPU scale). The same seed for every recipe: the
    same prompts and, at step 1, the same samples."""
    recipe, _, scale = arg.partition(",")
    cfg = addition_config(f"{NAME}_{recipe}", scale, recipe=recipe, total_steps=16, max_tokens=32, seed=seed)
    # DAPO's soft overlong punishment would shorten answers by itself and its dynamic
    # sampling would change which groups the learner sees: both off, so the recipes differ
    # only in their loss aggregation (and DAPO's clip range and zero-variance filter).
    return replace_values(cfg, {"recipe.overlong_buffer": 0, "rollout.dynamic_sampling": False})


def pooled_lengths(groups: list[dict], correct: bool) -> tuple[float, int]:
    """Mean length of the correct (or incorrect) responses pooled over `groups`, and their count."""
    lengths = np.concatenate([np.asarray(g["lengths"]).reshape(-1) for g in groups])
    rewards = np.concatenate([np.asarray(g["rewards"]).reshape(-1) for g in groups])
    chosen = lengths[(rewards >= 1.0) == correct]
    return (float(chosen.mean()) if chosen.size else float("nan")), int(chosen.size)


def summarise(recipe: str, records: list[dict], groups: list[dict]) -> dict:
    """First / last window (min(3, steps/2) steps) of reward, and of the lengths pooled over
    all responses of the window, so a late step with one wrong answer does not dominate."""
    k = max(1, min(3, len(records) // 2))
    row = {"recipe": recipe, "steps": len(records),
           "reward first": window_mean(records, "reward", first=k), "reward last": window_mean(records, "reward", last=k)}
    for side, window in (("first", groups[:k]), ("last", groups[-k:])):
        row[f"length_correct {side}"], row[f"n correct {side}"] = pooled_lengths(window, True)
        row[f"length_incorrect {side}"], row[f"n incorrect {side}"] = pooled_lengths(window, False)
    row["d length_correct"] = row["length_correct last"] - row["length_correct first"]
    row["d length_incorrect"] = row["length_incorrect last"] - row["length_incorrect first"]
    return row


INTERVAL_KEYS = ("reward first", "reward last", "length_correct first", "length_correct last", "d length_correct",
                 "length_incorrect first", "length_incorrect last", "d length_incorrect")



def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE (`powered_verdict`) on the stored paired interval."""
    from jaxrl_llm.reports.results import number

    return powered_verdict(number(numbers, "grpo - dr_grpo d length_incorrect"))


def main(argv: Sequence[str] | None = None) -> int:
    start = time.perf_counter()
    parser = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True)
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {RECIPES} "
                        "(grpo first; the deciding run: grpo,dr_grpo)")
    args = parser.parse_args(argv)
    recipes = tuple(r.strip() for r in args.recipes.split(","))
    if recipes[0] != "grpo" or len(recipes) < 2 or not set(recipes) <= set(RECIPES):
        parser.error(f"--recipes {args.recipes!r} is invalid; valid: grpo first, then one or both of {RECIPES[1:]}")
    chosen = stats.parse_seeds(args.seeds, ()) if args.seeds else ()
    powered = bool(set(chosen) & set(POWERED_SEEDS))
    if args.results and powered and chosen != POWERED_SEEDS:
        parser.error(f"--seeds {args.seeds} with --results is invalid: the powered run writes its result with all "
                     f"of seeds {','.join(map(str, POWERED_SEEDS))}; run a subset without --results (a later run "
                     "keeps it)")
    out = output_dir(args, NAME)
    from jaxrl_llm.train.run.metrics import read_groups, read_metrics
    from jaxrl_llm.train.run.plots import plot_runs

    done = run_seeded_experiment(args, out, recipes, get_config, QUICK)
    seeds, configs, runs = done.seeds, done.configs, done.runs
    first = [runs[(r, seeds[0])] for r in recipes]

    plot_runs(first, ["reward", "length_correct", "length_incorrect", "length_mean", "truncated_fraction",
                      "entropy"], out / "training.png", title=f"Length bias: seed {seeds[0]}, {len(recipes)} recipes")
    curves = {r: [per_step_lengths(read_groups(runs[(r, s)])) for s in seeds] for r in recipes}
    max_tokens = configs[(recipes[0], seeds[0])].rollout.max_tokens
    plot_seed_bands(curves, ("reward", "length_correct", "length_incorrect"), out / "seeds.png",
                    title=f"Length bias: {len(seeds)} seed(s) per recipe", limits=reward_length_limits(max_tokens))
    # The analytic view on real data: each recipe's implied per-token weight, from the
    # gradient of its loss, on the groups the GRPO runs actually sampled (all seeds pooled).
    batch = bias_report.batch_from_groups([g for s in seeds for g in read_groups(runs[("grpo", s)])], max_tokens)
    analytic = bias_report.run(str(out / "analytic"), recipes=recipes, batch=batch)
    exponents = {row["recipe"]: row["length_exponent"] for row in analytic}

    rows = []
    for r in recipes:
        per_seed = [summarise(r, read_metrics(runs[(r, s)]), read_groups(runs[(r, s)])) for s in seeds]
        row = {"recipe": r, "seeds": len(seeds), "steps": per_seed[0]["steps"]}
        for key in INTERVAL_KEYS:
            iv = stats.interval([p[key] for p in per_seed])
            row[key] = stats.format_interval(iv, signed=key.startswith("d "))
            row[f"{key} interval"] = iv.to_dict()
        row["n incorrect last"] = sum(p["n incorrect last"] for p in per_seed)
        row["length exponent"] = exponents[r]
        row["per seed"] = per_seed
        rows.append(row)
    grpo, dr = rows[0], rows[1]
    notes = [
        stats.seed_note(seeds, quick=args.quick, full_seeds=len(SEEDS)),
        f"Claim (Dr. GRPO paper): incorrect responses grow longer under GRPO than under Dr. GRPO at similar reward. "
        f"Here: change in mean incorrect length, GRPO {grpo['d length_incorrect']} vs Dr. GRPO "
        f"{dr['d length_incorrect']} tokens (correct: {grpo['d length_correct']} vs {dr['d length_correct']}); "
        f"final reward {grpo['reward last']} vs {dr['reward last']}.",
        "first/last: the first/last min(3, steps/2) steps; lengths pooled over their responses, per seed; "
        "n incorrect last: incorrect answers in the last window, summed over seeds. length exponent: slope of "
        "log|w/A| against log L of the per-token gradient weight on the GRPO runs' pooled groups "
        "(-1 = GRPO's 1/L, 0 = none).",
        "The reward of this task depends on length (a terse answer is the rewarded format); "
        "experiments/length_neutral.py and length_mechanism.py are the length-neutral tests.",
    ]
    write_summary(out, rows, ["recipe", "seeds", "steps", *INTERVAL_KEYS, "n incorrect last", "length exponent"],
                  title=f"Length bias ({'quick' if args.quick else 'full'})", notes=notes,
                  config={"name": NAME, "quick": args.quick, "seeds": list(seeds), "overrides": list(args.overrides),
                          "variants": {f"{r}_s{s}": c.to_dict() for (r, s), c in configs.items()}})
    print(f"wrote {out}/training.png, seeds.png, {out}/analytic/length_bias.png, {out}/summary.md")
    if args.results and "dr_grpo" in recipes:
        from jaxrl_llm.reports.results import write_result

        cfg = configs[("grpo", seeds[0])]
        setting = (f"{cfg.total_steps} steps x {cfg.rollout.prompts_per_step} prompts x "
                   f"{cfg.rollout.samples_per_prompt} samples, max {cfg.rollout.max_tokens} tokens, lr {cfg.train.lr}, "
                   f"{cfg.train.precision}, {cfg.rollout.engine} sampler; recipes {', '.join(recipes)}")
        command = "python experiments/length_bias.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        per_seed = {r: row["per seed"] for r, row in zip(recipes, rows)}
        path = write_result(deciding_result(per_seed, seeds, setting=setting, command=command,
                                            wall_s=time.perf_counter() - start, powered=powered), args.results)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
