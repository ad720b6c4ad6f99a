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

    python experiments/length_neutral.py --quick     # 3 recipes x seed 0 x 3 steps of 2 x 8, max 96 tokens
    python experiments/length_neutral.py             # 3 recipes x 5 seeds, the same size
    python experiments/length_neutral.py total_steps=12 rollout.prompts_per_step=4 rollout.max_tokens=128
                                                     # the longer form (hours on a 2-core CPU)

--quick is the full size's seed 0: its three runs, copied into the full size's
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

from typing import Sequence

import numpy as np

from base_configs import addition_config
from jaxrl_llm.reports import stats
from jaxrl_llm.reports.seed_curves import change, per_step_lengths, plot_seed_bands, reward_length_limits
from jaxrl_llm.reports.runs import (experiment_parser, interval_row, markdown_table, output_dir,
                                    run_seeded_experiment, write_summary)
from jaxrl_llm.train.config import Config, replace_values

NAME = "length_neutral"
RECIPES = ("grpo", "dr_grpo", "dapo")
SEEDS = (0, 1, 2, 3, 4)
QUICK_SEEDS = (0,)
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


def verdict(paired: dict) -> str:
    """Against the derived direction (GRPO relative to Dr. GRPO: incorrect longer, correct shorter):
    reproduced when both paired intervals exclude 0 in that direction, not reproduced when either
    excludes 0 the other way, else inconclusive."""
    wrong = stats.Interval(**paired["length_incorrect interval"])
    right = stats.Interval(**paired["length_correct interval"])
    if (wrong.excludes_zero() and wrong.high < 0) or (right.excludes_zero() and right.low > 0):
        return "not reproduced"
    if wrong.excludes_zero() and wrong.low > 0 and right.excludes_zero() and right.high < 0:
        return "reproduced"
    return "inconclusive"



# ------------------------------------------------------------- the verdict rule (issue 36)
CLAIM = ("under GRPO wrong answers grow and right ones shorten relative to Dr. GRPO, on a length-neutral format "
         "(Liu et al. 2025, arXiv 2503.20783)")
VERDICT_RULE = ("paired GRPO - Dr. GRPO length change per seed, 95% Student-t: reproduced if the incorrect interval "
                "lies above 0 and the correct one below 0, not reproduced if either lies on the other side, "
                "otherwise inconclusive (`verdict`)")


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE (`verdict`) on the stored paired intervals."""
    return verdict({f"{k} interval": numbers[f"grpo - dr_grpo {k}"] for k in ("length_incorrect", "length_correct")})


def main(argv: Sequence[str] | None = None) -> int:
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS)).parse_args(argv)
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
    found = verdict(paired[0])
    notes = [stats.seed_note(seeds, quick=args.quick, full_seeds=len(SEEDS)),
             "d length_*: last minus first step of the mean length (tokens) of correct / incorrect responses, "
             "per seed; truncated: mean fraction of responses without EOS.",
             "Paired: per seed, the mean over steps 2..T of the recipe's mean length (incorrect / correct "
             "responses) minus Dr. GRPO's at the same step (the same seed draws the same prompts and the same "
             "first batch in every recipe); mean and 95% interval over seeds.\n\n"
             + markdown_table(paired, ["recipe", *PAIRED]),
             f"Derived (docs/objectives.md#length-drift-on-a-length-neutral-task): relative to Dr. GRPO, "
             f"incorrect responses longer and correct ones shorter under GRPO; token-mean in between. "
             f"Verdict for GRPO (both paired intervals must exclude 0 in that direction): {found}.",
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
