"""Experiment 12: a verifiers environment learns (issue 62): a verifiers SingleTurnEnv defined here, on a local
procedural data set, trained through task.name=verifiers.

The environments are written as a verifiers user writes one (the classic API of verifiers 0.3.1,
docs/environments.md), over the 100 one-digit sums "What is a + b? Answer with just the number." (75 in
``dataset``, the 25 with (10a + b) % 4 == 0 in ``eval_dataset``); verifiers drives each episode, the
project's JAX sampler writes the reply, the environment's ``vf.Rubric`` scores it. Two settings:

* ``tiny`` (the deciding one): ``load_word_start_environment``, a Rubric of one function, ``word_starts``:
  the share of the reply's (at most 6) tokens that start a word, scored on the text as experiment 10
  scores it (spaces, capped at 6), played by experiment 10's tiny decoder (2 layers, width 32, SmolLM2's
  tokenizer, embeddings x25: a peaked next-token distribution; the random policy scores ~0.2).
  GRPO, 2 prompts x 8 samples of 6 tokens, lr 1e-2, 10 steps: experiment 10's sizes, sized there on its
  tuning seed (not here).
* ``smollm2``: ``load_environment``, a Rubric of one function, ``correct_sum`` (1.0 when the last
  integer of the reply is a + b), SmolLM2-135M-Instruct, Dr. GRPO, 4 x 8 samples of 12 tokens, lr 2e-5.
  Its first deciding run (seeds 621-623) was stopped by the machine: the kernel's OOM killer ended it
  during step 2 of seed 621 on a 24 GB machine shared by five jobs (step 1 took 28 min at load 13-20;
  its reward 0.281). Not decided here.

Per step the mean rubric reward of the step's episodes (metrics.jsonl "reward"); per seed the mean of
the last 3 steps minus the first 3.

    python experiments/verifiers_learning.py --results experiments/results/verifiers_learning.json  # deciding (tiny)
    python experiments/verifiers_learning.py --quick         # one seed, 6 steps
    jaxrl train --config experiments/verifiers_learning.py:smollm2   # the SmolLM2 setting, one run
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Mapping, Sequence

from learning_rule import WINDOW, LearningClaim, claim_verdict, conclude, learning_config, rule_text, window_change
from jaxrl_llm.train.config import Config, RecipeConfig, RolloutConfig, TaskConfig, TrainConfig

NAME = "verifiers_learning"
STEPS = 10
SEEDS, QUICK_SEEDS = (641, 642, 643), (641,)  # fresh: 621-623 were the stopped SmolLM2 run's
SETTINGS = ("tiny", "smollm2")
MAX_WORDS = 6  # the tiny setting's reply length, experiment 10's MAX_TOKENS
QUICK = ("total_steps=6",)
REWARD = "rubric reward: last 3 - first 3 steps"
CLAIMS = {REWARD: "up"}
CLAIM = ("GRPO-style training through task.name=verifiers raises a verifiers environment's rubric reward (a "
         "SingleTurnEnv with a one-function Rubric, played by a tiny decoder)")
VERDICT_RULE = rule_text(CLAIMS)
RESULT = LearningClaim(
    name=NAME, script=NAME, title="a verifiers environment learns (SingleTurnEnv + Rubric, tiny decoder)",
    claim=CLAIM, claims=CLAIMS, verdict_rule=VERDICT_RULE, headline=REWARD, full_seeds=len(SEEDS),
    statistic="per step the mean rubric reward of the step's episodes; per seed the mean of the last 3 steps minus "
              "the first 3")
_INTEGER = re.compile(r"-?\d+")


def _rows(held_out: bool) -> list[dict[str, str]]:
    return [{"question": f"What is {a} + {b}? Answer with just the number.", "answer": str(a + b)}
            for a in range(10) for b in range(10) if ((10 * a + b) % 4 == 0) == held_out]


def correct_sum(completion, answer) -> float:
    """1.0 when the last integer of the last reply equals the answer, else 0.0."""
    numbers = _INTEGER.findall(completion[-1].content or "")
    return float(bool(numbers) and numbers[-1] == answer)


def word_starts(completion) -> float:
    """Share of the reply's (at most MAX_WORDS) tokens that start a word, read as experiment 10 reads it: spaces."""
    return min((completion[-1].content or "").count(" "), MAX_WORDS) / MAX_WORDS


def _env(func):
    import verifiers as vf
    from datasets import Dataset

    return vf.SingleTurnEnv(dataset=Dataset.from_list(_rows(False)), eval_dataset=Dataset.from_list(_rows(True)),
                            rubric=vf.Rubric(funcs=[func], weights=[1.0]))


def load_word_start_environment():
    return _env(word_starts)


def load_environment():
    return _env(correct_sum)


def get_config(arg: str = "smollm2", seed: int = 0, model_dir: str = "") -> Config:
    """ARG = "tiny" (the tiny decoder saved in `model_dir`, experiment 10's sizes) or "smollm2" (Dr. GRPO,
    4 prompts x 8 samples of <= 12 tokens, lr 2e-5: experiment 4's addition setting, through verifiers)."""
    if arg not in SETTINGS:
        from jaxrl_llm.train.config import ConfigError

        raise ConfigError(f"experiments/verifiers_learning.py:{arg} is invalid; valid: one of {SETTINGS}")
    if arg == "tiny":
        from jaxrl_llm.train.config import replace_values

        return replace_values(get_config("smollm2", seed), {
            "name": f"{NAME}_tiny", "run_dir": f"runs/{NAME}_tiny_s{seed}", "model.source": model_dir or "smollm2",
            "recipe.name": "grpo", "rollout.prompts_per_step": 2, "rollout.max_tokens": MAX_WORDS, "train.lr": 1e-2,
            "task.kwargs": {"env_id": "experiments.verifiers_learning:load_word_start_environment"},
            "checkpoint.every_steps": STEPS})
    return learning_config(
        NAME, seed, STEPS,
        rollout=RolloutConfig(engine="jax", server_dtype="float32", prompts_per_step=4, samples_per_prompt=8,
                              max_tokens=12, temperature=1.0),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=2e-5, warmup_steps=0, micro_batch_size=16, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="verifiers", kwargs={"env_id": "experiments.verifiers_learning:load_environment"}, max_turns=1,
                        eval_size=0),
    )


def seed_numbers(rewards: Sequence[float]) -> dict[str, float]:
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {REWARD: window_change(rewards), "rubric reward, first 3 steps": mean(rewards[:WINDOW]),
            "rubric reward, last 3 steps": mean(rewards[-WINDOW:])}


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored numbers."""
    return claim_verdict(numbers, CLAIMS)


def setting_text(cfg: Config) -> str:
    """The stored result's setting (the config's sizes in words)."""
    return (f"verifiers SingleTurnEnv (75 one-digit sums, Rubric: share of the reply's <= {MAX_WORDS} tokens "
            f"that start a word), {cfg.total_steps} steps x {cfg.rollout.prompts_per_step} prompts x "
            f"{cfg.rollout.samples_per_prompt} samples, <= {cfg.rollout.max_tokens} tokens, {cfg.recipe.name}, "
            f"lr {cfg.train.lr}, JAX sampler fp32, experiment 10's tiny decoder (2 layers, width 32, "
            "embeddings x25)")


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment
    from jaxrl_llm.train.run.metrics import read_metrics

    start = time.perf_counter()
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True).parse_args(argv)
    out = output_dir(args, NAME)
    from off_policy import tiny_model

    model_dir = tiny_model(out / "model")
    done = run_seeded_experiment(args, out, ("tiny",), lambda v, s: get_config(v, s, model_dir), QUICK)
    per_seed, curves = {}, {}
    for seed in done.seeds:
        rewards = [float(r["reward"]) for r in read_metrics(done.runs[("tiny", seed)] / "metrics.jsonl")]
        per_seed[seed], curves[seed] = seed_numbers(rewards), [round(x, 4) for x in rewards]
    cfg = done.configs[("tiny", done.seeds[0])]
    conclude(RESULT, per_seed, args=args, argv=argv, out=out, config=cfg, started=start,
             setting=setting_text(cfg),
             notes=[f"load average at the end: {[round(x, 2) for x in os.getloadavg()]}",
                    "the SmolLM2 setting (correct_sum) was stopped by the OOM killer in step 2 of seed 621 (step 1: "
                    "reward 0.281); not decided", "rubric reward per step per seed: " + json.dumps(curves)])
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
