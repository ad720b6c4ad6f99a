"""Experiment 6: length bias with SmolLM2 on a length-neutral format, over seeds.

Question (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783): with a reward that cannot
depend on length, do incorrect responses grow under GRPO relative to Dr. GRPO
(constant normaliser), with DAPO's token-mean in between? Experiment 1 cannot tell,
because there a terse answer is the rewarded format. Here the task is
`addition_answer_first` (data/answer_first.py): "What is a + b? Start your reply
with the number, then explain how you got it.", graded on the leading answer alone
(the bare sum, or the question's equation "a + b = N" with which SmolLM2 opens most
replies), so the text after it is free. Sampling at temperature 0.7: at 1.0 the model
rambles past 128 tokens in most replies. The truncated fraction is reported (31% at
128 tokens in a step-0 probe).

DAPO here is the `dapo` recipe: clip-higher (eps_high 0.28), token-mean aggregation and
the zero-variance group filter; its soft overlong penalty is switched off
(`recipe.overlong_buffer=0`, which keeps the reward length-neutral) and so is dynamic
sampling (`rollout.dynamic_sampling=false`, CPU cost).

    python experiments/length_neutral.py --results experiments/results/length_neutral.json   # the deciding run
    python experiments/length_neutral.py --quick     # 3 recipes x seed 401 x 3 steps of 2 x 8, max 96 tokens
    python experiments/length_neutral.py             # 3 recipes x 5 seeds, the same size
    python experiments/length_neutral.py total_steps=12 rollout.prompts_per_step=4 rollout.max_tokens=128
                                                     # the longer form (hours on a 2-core CPU)

--quick is the full size's first seed: its three runs, copied into the full size's
directory, are kept there. The same seed draws the same prompts at every step and the
same first batch in every recipe, so the recipes are compared seed by seed (paired);
the rollouts of steps 2 and 3 show the effect of one and two updates. The runs share a
persistent compilation cache (<out>/jax_cache), and each run's compiled programs are
dropped after it.

Writes to runs/experiments/length_neutral/<quick|full>/: <recipe>_s<seed>/ (runs),
lengths.png (reward and mean length of correct / incorrect responses per step: mean
and 95% band over seeds, seeds as points), summary.md / .json.
"""
from __future__ import annotations

import math
import shlex
import sys
import time
from typing import Mapping, Sequence

import numpy as np

from base_configs import addition_config
from jaxrl_llm.reports import stats
from jaxrl_llm.reports.seed_curves import change, per_step_lengths, plot_seed_bands, reward_length_limits
from jaxrl_llm.reports.runs import (experiment_parser, interval_row, markdown_table, output_dir,
                                    run_seeded_experiment, write_summary)
from jaxrl_llm.train.config import Config, replace_values

NAME = "length_neutral"
RECIPES = ("grpo", "dr_grpo", "dapo")
SEEDS = (401, 402, 403, 404, 405)  # fresh (issue 51): seeds 0-4 ran before the rule was fixed
QUICK_SEEDS = (401,)
QUICK = ()  # --quick: the full size with seed 0 only
# Temperature 0.7: at 1.0 SmolLM2 rambles (step 0, 8 prompts x 4 samples, 128 tokens: 4/32 right,
# 56% truncated); at 0.7 9/32 right, 31% truncated, half the groups mixed (experiments/README.md).
TEMPERATURE = 0.7


def get_config(arg: str = "grpo", seed: int = 0) -> Config:
    """ARG = "<recipe>" or "<recipe>,<seed>" (CPU; a seed in ARG wins over `seed`)."""
    recipe, _, seed_text = arg.partition(",")
    cfg = addition_config(f"{NAME}_{recipe}", recipe=recipe, total_steps=3, max_tokens=96,
                          seed=int(seed_text) if seed_text else seed)
    # DAPO's soft overlong punishment would make the reward depend on length, and its dynamic
    # sampling would multiply the CPU cost: both off (the zero-variance filter stays).
    # Micro-batches of 8 keep a run under ~8 GB of memory.
    return replace_values(cfg, {"task.name": "addition_answer_first", "rollout.prompts_per_step": 2,
                                "rollout.temperature": TEMPERATURE, "train.micro_batch_size": 8,
                                "recipe.overlong_buffer": 0, "rollout.dynamic_sampling": False})


def seed_row(curves: dict[str, list[float]], records: list[dict]) -> dict:
    """One run: last minus first step of each curve (first/last finite value), truncated fraction."""
    return {"d length_correct": change(curves["length_correct"]),
            "d length_incorrect": change(curves["length_incorrect"]),
            "reward first": curves["reward"][0], "reward last": curves["reward"][-1],
            "length_incorrect first": curves["length_incorrect"][0],
            "truncated": float(np.mean([r.get("truncated_fraction", np.nan) for r in records]))}


PAIRED = ("length_incorrect", "length_correct")


def paired_difference(curve: Sequence[float], baseline: Sequence[float]) -> float:
    """Mean over the updated steps (2..T) of curve - baseline, over the steps where both are
    defined (nan if none). The same seed draws the same prompts at every step in every recipe
    and the same first batch, so this is a paired comparison on identical prompts."""
    diffs = [a - b for a, b in zip(curve[1:], baseline[1:]) if np.isfinite(a) and np.isfinite(b)]
    return float(np.mean(diffs)) if diffs else float("nan")


def paired_rows(curves: dict[str, list[dict]], baseline: str = "dr_grpo") -> list[dict]:
    """Each other recipe minus `baseline`, seed by seed (`paired_difference` of the mean length of
    incorrect and of correct responses): mean and 95% interval over seeds."""
    rows = []
    for recipe, seeds in curves.items():
        if recipe == baseline:
            continue
        row = {"recipe": f"{recipe} - {baseline}"}
        for key in PAIRED:
            iv = stats.interval([paired_difference(a[key], b[key]) for a, b in zip(seeds, curves[baseline])])
            row[key] = stats.format_interval(iv, signed=True)
            row[f"{key} interval"] = iv.to_dict()
        rows.append(row)
    return rows


# ------------------------------------------------------------- the verdict rule (issue 51, fixed before the run)
CLAIM = ("under GRPO wrong answers grow relative to Dr. GRPO on a length-neutral format, and right ones do not "
         "(Liu et al. 2025, arXiv 2503.20783)")
MIN_SEEDS = 3
MARGIN_SHARE = 0.05  # the equivalence margin: 5% of rollout.max_tokens (4.8 tokens at 96), fixed before the run
WRONG_KEY, RIGHT_KEY = (f"grpo - dr_grpo {k}" for k in PAIRED)
MARGIN_KEY = "equivalence margin (tokens)"
EXCLUSION_RULE = ("a seed counts for a paired length when both recipes sampled at least one response of that kind "
                  "(incorrect / correct) at some updated step: otherwise the difference is undefined (nan)")
VERDICT_RULE = (
    "per counted seed: paired GRPO - Dr. GRPO mean length over the updated steps (2..T), of incorrect and of "
    f"correct responses; 95% Student-t over seeds. Not measured (inconclusive) with fewer than {MIN_SEEDS} counted "
    "seeds of incorrect responses. reproduced if the incorrect interval lies above 0 and the correct one does not "
    "lie above 0; not reproduced if the incorrect interval lies below 0 or inside +-margin (margin = "
    f"{MARGIN_SHARE:g} x rollout.max_tokens, fixed before the run: no effect); inconclusive otherwise")


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored numbers (reports.results.number)."""
    from jaxrl_llm.reports.results import number

    wrong, right, margin = number(numbers, WRONG_KEY), number(numbers, RIGHT_KEY), number(numbers, MARGIN_KEY).mean
    if wrong.n < MIN_SEEDS:
        return "inconclusive"
    if wrong.low > 0 and not (right.n >= 2 and right.low > 0):
        return "reproduced"
    if wrong.high < 0 or (-margin < wrong.low and wrong.high < margin):
        return "not reproduced"
    return "inconclusive"


def deciding_result(paired_per_seed: Mapping[str, Mapping[int, float]], *, max_tokens: int, setting: str,
                    command: str, wall_s: float, seeds: Sequence[int], notes: Sequence[str] = ()):
    """The stored result of {"length_incorrect" | "length_correct": {seed: paired_difference}}:
    EXCLUSION_RULE (nan differences do not count), then VERDICT_RULE."""
    from jaxrl_llm.reports.results import ExperimentResult, interval_of, keyed

    stored = {f"grpo - dr_grpo {k}": keyed({s: v for s, v in paired_per_seed[k].items() if math.isfinite(v)})
              for k in PAIRED}
    numbers = {k: interval_of(v).to_dict() for k, v in stored.items()}
    numbers[MARGIN_KEY] = {"mean": MARGIN_SHARE * max_tokens, "low": math.nan, "high": math.nan, "n": 1}
    excluded = {str(s): "no " + " and no ".join(k.split("_")[1] + " response" for k in PAIRED
                                               if not math.isfinite(paired_per_seed[k][s]))
                for s in seeds if not all(math.isfinite(paired_per_seed[k][s]) for k in PAIRED)}
    counted = tuple(int(s) for s in stored[WRONG_KEY])
    return ExperimentResult(
        name=NAME, title="length bias on a length-neutral format (SmolLM2-135M, answer first then free text)",
        claim=CLAIM, setting=setting, command=command, seeds=counted,
        statistic="paired GRPO - Dr. GRPO mean length over the updated steps, incorrect and correct responses",
        interval_method="mean and 95% Student-t over seeds, paired by seed (same prompts, same first batch)",
        verdict_rule=VERDICT_RULE, exclusion_rule=EXCLUSION_RULE, excluded=excluded,
        verdict=rule_verdict(numbers), headline=WRONG_KEY, numbers=numbers, per_seed=stored, wall_s=wall_s,
        notes=tuple(notes))


def main(argv: Sequence[str] | None = None) -> int:
    import os

    start, load_start = time.perf_counter(), os.getloadavg()
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True).parse_args(argv)
    out = output_dir(args, NAME)
    from jaxrl_llm.train.run.metrics import read_groups, read_metrics

    # 3 x seeds runs of the same shapes share the compiled programs (from disk); one run's in memory
    done = run_seeded_experiment(args, out, RECIPES, get_config, QUICK, clear_caches=True)
    seeds = done.seeds
    curves = done.per_variant(lambda run: per_step_lengths(read_groups(run)))
    per_seed = {r: {s: seed_row(c, read_metrics(done.runs[(r, s)])) for c, s in zip(curves[r], seeds)}
                for r in RECIPES}
    rows = [interval_row({"recipe": r}, per_seed[r], ("d length_incorrect", "d length_correct", "reward first",
                                                      "reward last", "truncated"),
                         signed=lambda key: key.startswith("d ")) for r in RECIPES]
    paired = paired_rows(curves)
    cfg = done.configs[(RECIPES[0], seeds[0])]
    setting = (f"{'--quick: ' if args.quick else ''}{cfg.task.name}, {cfg.total_steps} steps x "
               f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.samples_per_prompt} samples, max "
               f"{cfg.rollout.max_tokens} tokens, temperature {cfg.rollout.temperature}, lr {cfg.train.lr}, "
               f"{cfg.train.precision}, {cfg.rollout.engine} sampler, SmolLM2-135M; recipes {', '.join(RECIPES)}")
    per_pair = {k: {s: paired_difference(a[k], b[k]) for s, a, b in zip(seeds, curves["grpo"], curves["dr_grpo"])}
                for k in PAIRED}
    command = "python experiments/length_neutral.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = deciding_result(per_pair, max_tokens=cfg.rollout.max_tokens, setting=setting, command=command,
                             wall_s=time.perf_counter() - start, seeds=seeds,
                             notes=[f"load average at the start: {[round(x, 2) for x in load_start]}"])
    found = result.verdict
    notes = [stats.seed_note(seeds, quick=args.quick, full_seeds=len(SEEDS)),
             "d length_*: last minus first step of the mean length (tokens) of correct / incorrect responses, "
             "per seed; truncated: mean fraction of responses without EOS.",
             "Paired: per seed, the mean over steps 2..T of the recipe's mean length (incorrect / correct "
             "responses) minus Dr. GRPO's at the same step (the same seed draws the same prompts and the same "
             "first batch in every recipe); mean and 95% interval over seeds.\n\n"
             + markdown_table(paired, ["recipe", *PAIRED]),
             f"Derived (docs/objectives.md#length-drift-on-a-length-neutral-task): relative to Dr. GRPO, "
             f"incorrect responses longer and correct ones shorter under GRPO; token-mean in between. "
             f"Verdict for GRPO (VERDICT_RULE: {VERDICT_RULE}): {found}.",
             "DAPO = the dapo recipe: clip-higher + token-mean + zero-variance filter, overlong penalty off."]
    write_summary(out, rows + paired, ["recipe", "d length_incorrect", "d length_correct", "reward first",
                                       "reward last", "truncated", *PAIRED],
                  title=f"Length-neutral length bias ({'quick' if args.quick else 'full'})",
                  notes=notes, config={"name": NAME, "quick": args.quick, "seeds": list(seeds),
                                       "overrides": list(args.overrides), "verdict": found,
                                       "variants": {f"{r}_s{s}": c.to_dict() for (r, s), c in done.configs.items()}})
    plot_seed_bands(curves, ("reward", "length_correct", "length_incorrect"), out / "lengths.png",
                    title=f"SmolLM2, answer first then free text: {len(seeds)} seeds per recipe",
                    limits=reward_length_limits(next(iter(done.configs.values())).rollout.max_tokens))
    print(f"wrote {out}/lengths.png, {out}/summary.md")
    if args.results:
        from jaxrl_llm.reports.results import write_result

        print(f"[experiment] wrote {write_result(result, args.results)}: {result.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
