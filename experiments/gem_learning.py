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

import json
import time
from typing import Mapping, Sequence

from learning_rule import WINDOW, LearningClaim, claim_verdict, conclude, learning_config, rule_text, window_change
from jaxrl_llm.train.config import Config, RecipeConfig, RolloutConfig, TaskConfig, TrainConfig

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
RESULT = LearningClaim(
    name=NAME, script=NAME, title="a GEM game learns (SmolLM2-135M, GuessTheNumber-easy)", claim=CLAIM, claims=CLAIMS,
    verdict_rule=VERDICT_RULE, headline=SUCCESS, full_seeds=len(SEEDS), tuning_seeds=TUNING_SEEDS,
    statistic="per step, from every episode's summed GEM rewards: share won (>= 1.0) and share ended by GEM's "
              "format error (< 0); per seed the mean of the last 3 steps minus the first 3")


def get_config(arg: str = "", seed: int = 0) -> Config:
    """The one variant (ARG unused): Dr. GRPO, 4 games x 4 episodes per step, 8 steps, JAX sampler. Sized by the
    tuning seed 0 (4 games x 8 episodes): its first step took 645 s (compiles included) at load ~14 on 2 cores;
    8 steps (not 10) so that three seeds fit the quiet half hour this session had (the first deciding run, 10
    steps, was ended by the OOM killer before its first step finished)."""
    return learning_config(
        NAME, seed, STEPS,
        # the prompt (system + few-shot + GEM's instructions) is ~200 tokens; a turn is a short guess + a ~30-token hint
        rollout=RolloutConfig(engine="jax", server_dtype="float32", prompts_per_step=4, samples_per_prompt=4,
                              max_tokens=160, temperature=1.0),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=5e-5, warmup_steps=0, micro_batch_size=8, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="gem", kwargs={"env_id": ENV_ID, "prompt_messages": PROMPT_MESSAGES}, max_turns=4,
                        turn_max_tokens=12, eval_size=0),
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


def setting_text(cfg: Config) -> str:
    """The stored result's setting (the config's sizes in words)."""
    return (f"GEM {ENV_ID} + a system prompt and one few-shot exchange, {cfg.total_steps} steps x "
            f"{cfg.rollout.prompts_per_step} games x {cfg.rollout.samples_per_prompt} episodes, <= "
            f"{cfg.task.max_turns} turns of <= {cfg.task.turn_max_tokens} tokens, {cfg.recipe.name}, lr "
            f"{cfg.train.lr}, JAX sampler fp32, SmolLM2-135M-Instruct")


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment
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
    cfg = done.configs[("dr_grpo", done.seeds[0])]
    conclude(RESULT, per_seed, args=args, argv=argv, out=out, config=cfg, started=start,
             setting=setting_text(cfg),
             notes=["per-step shares per seed: " + json.dumps(curves)])
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
