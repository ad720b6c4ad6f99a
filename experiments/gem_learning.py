"""Experiment 11: a GEM game learns (issue 62): SmolLM2-135M-Instruct on GEM's GuessTheNumber-v0-easy.

GEM's game unchanged (task.name=gem: a secret in 1..10, four guesses written as \\boxed{N}, GEM's
"higher"/"lower" hints, GEM's rewards: 1.0 for the secret, -0.1 for a reply without a \\boxed{}
number, which ends the episode). With GEM's observation alone SmolLM2 writes the format in about
1 of 64 first replies (docs/environments.md), too rarely for a group baseline to learn from; a
system prompt and one few-shot exchange before GEM's first observation (task.kwargs.prompt_messages,
the part GEM's own trainers put in a prompt template) bring it to about 24 of 64. From there, does
GRPO-style training (Dr. GRPO) raise the share of games won and lower the share of format errors?

Per step, from groups.jsonl (every episode's summed GEM rewards): success = share of episodes
whose rewards sum to >= 1.0 (the secret found), format error = share whose sum is < 0 (only GEM's
-0.1 format error is negative in this game). Per seed: last 3 steps minus first 3.

    python experiments/gem_learning.py --results experiments/results/gem_learning.json   # the deciding run
    python experiments/gem_learning.py --quick        # one seed, 6 steps
    jaxrl train --config experiments/gem_learning.py  # one run (seed 0)
"""
from __future__ import annotations

import shlex
import sys
import time
from typing import Mapping, Sequence

from learning_rule import WINDOW, claim_verdict, numbers_over_seeds, rule_text, window_change
from jaxrl_llm.train.config import (CheckpointConfig, Config, MetricsConfig, ModelConfig, RecipeConfig, RolloutConfig,
                                    TaskConfig, TrainConfig)

NAME = "gem_learning"
ENV_ID = "game:GuessTheNumber-v0-easy"
PROMPT_MESSAGES = [
    {"role": "system", "content": "You play Guess The Number. Reply with one guess only, written as \\boxed{N}."},
    {"role": "user", "content": "Enter your first guess."},
    {"role": "assistant", "content": "\\boxed{5}"},
]
STEPS = 8
SEEDS, QUICK_SEEDS = (611, 612, 613), (611,)
TUNING_SEEDS = (0,)  # the timing / format-rate runs that chose this setting; they never count
QUICK = ("total_steps=6",)
SUCCESS, FORMAT = "success share: last 3 - first 3 steps", "format error share: last 3 - first 3 steps"
CLAIMS = {SUCCESS: "up", FORMAT: "down"}
CLAIM = ("GRPO-style training on a GEM game raises its success and lowers its format errors (SmolLM2-135M, GEM "
         "GuessTheNumber-v0-easy, a few-shot exchange before GEM's observation)")
VERDICT_RULE = rule_text(CLAIMS)


def get_config(arg: str = "", seed: int = 0) -> Config:
    """The one variant (ARG unused): Dr. GRPO, 4 games x 4 episodes per step, 8 steps, JAX sampler. Sized by the
    tuning seed 0 (4 games x 8 episodes): its first step took 645 s (compiles included) at load ~14 on 2 cores;
    8 steps (not 10) so that three seeds fit the quiet half hour this session had (the first deciding run, 10
    steps, was ended by the OOM killer before its first step finished)."""
    return Config(
        name=NAME,
        seed=seed,
        run_dir=f"runs/{NAME}_s{seed}",
        total_steps=STEPS,
        model=ModelConfig(source="smollm2"),
        # the prompt (system + few-shot + GEM's instructions) is ~200 tokens; a turn is a short guess + a ~30-token hint
        rollout=RolloutConfig(engine="jax", server_dtype="float32", prompts_per_step=4, samples_per_prompt=4,
                              max_tokens=160, temperature=1.0),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=5e-5, warmup_steps=0, micro_batch_size=8, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="gem", kwargs={"env_id": ENV_ID, "prompt_messages": PROMPT_MESSAGES}, max_turns=4,
                        turn_max_tokens=12, eval_size=0),
        checkpoint=CheckpointConfig(every_steps=4, keep=1, async_save=False),
        metrics=MetricsConfig(tensorboard=False, progress_every=1),
    )


def step_shares(groups: Sequence[Mapping]) -> tuple[list[float], list[float]]:
    """(success share, format error share) per step of groups.jsonl records."""
    success, errors = [], []
    for record in groups:
        rewards = [r for row in record["rewards"] for r in row]
        success.append(sum(r >= 1.0 for r in rewards) / len(rewards))
        errors.append(sum(r < 0.0 for r in rewards) / len(rewards))
    return success, errors


def seed_numbers(groups: Sequence[Mapping]) -> dict[str, float]:
    success, errors = step_shares(groups)
    first, last = slice(0, WINDOW), slice(-WINDOW, None)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {SUCCESS: window_change(success), FORMAT: window_change(errors),
            "success share, first 3 steps": mean(success[first]), "success share, last 3 steps": mean(success[last]),
            "format error share, first 3 steps": mean(errors[first]),
            "format error share, last 3 steps": mean(errors[last])}


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored numbers."""
    return claim_verdict(numbers, CLAIMS)


def deciding_result(per_seed: Mapping[int, Mapping[str, float]], curves: Mapping[int, Mapping[str, list]], *,
                    setting: str, command: str, wall_s: float, notes: Sequence[str] = ()):
    import json

    from jaxrl_llm.reports.results import ExperimentResult

    numbers, stored = numbers_over_seeds(per_seed)
    return ExperimentResult(
        name=NAME, title="a GEM game learns (SmolLM2-135M, GuessTheNumber-easy)", claim=CLAIM, setting=setting,
        command=command, seeds=tuple(per_seed), tuning_seeds=TUNING_SEEDS,
        statistic="per step, from every episode's summed GEM rewards: share won (>= 1.0) and share ended by GEM's "
                  "format error (< 0); per seed the mean of the last 3 steps minus the first 3",
        interval_method="mean and 95% Student-t over seeds", verdict_rule=VERDICT_RULE,
        verdict=rule_verdict(numbers), headline=SUCCESS, numbers=numbers, per_seed=stored, wall_s=wall_s,
        notes=(*notes, "per-step shares per seed: " + json.dumps(curves)))


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.reports.results import write_result
    from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment, write_summary
    from jaxrl_llm.reports import stats
    from jaxrl_llm.train.run.metrics import read_groups

    start = time.perf_counter()
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True).parse_args(argv)
    out = output_dir(args, NAME)
    done = run_seeded_experiment(args, out, ("dr_grpo",), get_config, QUICK)
    per_seed, curves = {}, {}
    for seed in done.seeds:
        groups = read_groups(done.runs[("dr_grpo", seed)])
        per_seed[seed] = seed_numbers(groups)
        success, errors = step_shares(groups)
        curves[seed] = {"success": [round(x, 4) for x in success], "format error": [round(x, 4) for x in errors]}
    numbers, _ = numbers_over_seeds(per_seed)
    rows = [{"statistic": k, "mean [95% interval] (n)": stats.format_interval(stats.Interval(**v), signed=" - " in k)}
            for k, v in numbers.items()]
    cfg = done.configs[("dr_grpo", done.seeds[0])]
    write_summary(out, rows, ["statistic", "mean [95% interval] (n)"], title=f"GEM learning ({NAME})",
                  notes=[stats.seed_note(done.seeds, quick=args.quick, full_seeds=len(SEEDS)),
                         f"verdict by the fixed rule: {rule_verdict(numbers)}"],
                  config={"name": NAME, "seeds": list(done.seeds), "config": cfg.to_dict()})
    if args.results:
        setting = (f"{'--quick: ' if args.quick else ''}GEM {ENV_ID} + a system prompt and one few-shot exchange, "
                   f"{cfg.total_steps} steps x {cfg.rollout.prompts_per_step} games x {cfg.rollout.samples_per_prompt} "
                   f"episodes, <= {cfg.task.max_turns} turns of <= {cfg.task.turn_max_tokens} tokens, "
                   f"{cfg.recipe.name}, lr {cfg.train.lr}, JAX sampler fp32, SmolLM2-135M-Instruct")
        command = "python experiments/gem_learning.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        result = deciding_result(per_seed, curves, setting=setting, command=command,
                                 wall_s=time.perf_counter() - start)
        print(f"[experiment] wrote {write_result(result, args.results)}: {result.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
