"""Experiment 12: a verifiers environment learns (issue 62): SmolLM2-135M-Instruct on a verifiers
SingleTurnEnv defined here, on a local procedural data set.

The environment is written as a verifiers user writes one (the classic API of verifiers 0.3.1,
docs/environments.md): ``load_environment`` returns a ``vf.SingleTurnEnv`` over the 100 one-digit
sums "What is a + b? Answer with just the number." (75 in ``dataset``, the 25 with (10a + b) % 4 == 0
in ``eval_dataset``), scored by a ``vf.Rubric`` of one function, ``correct_sum``: 1.0 when the last
integer of the reply is a + b. It runs through task.name=verifiers (verifiers drives each episode,
the project's JAX sampler writes the reply, the rubric scores it). Does Dr. GRPO on the rubric's
reward raise it?

Per step the mean rubric reward of the step's 32 episodes (metrics.jsonl "reward"); per seed the
mean of the last 3 steps minus the first 3.

    python experiments/verifiers_learning.py --results experiments/results/verifiers_learning.json  # deciding run
    python experiments/verifiers_learning.py --quick        # one seed, 6 steps
    jaxrl train --config experiments/verifiers_learning.py  # one run (seed 0)
"""
from __future__ import annotations

import re
import shlex
import sys
import time
from typing import Mapping, Sequence

from learning_rule import WINDOW, claim_verdict, numbers_over_seeds, rule_text, window_change
from jaxrl_llm.train.config import (CheckpointConfig, Config, MetricsConfig, ModelConfig, RecipeConfig, RolloutConfig,
                                    TaskConfig, TrainConfig)

NAME = "verifiers_learning"
STEPS = 10
SEEDS, QUICK_SEEDS = (621, 622, 623), (621,)
QUICK = ("total_steps=6",)
REWARD = "rubric reward: last 3 - first 3 steps"
CLAIMS = {REWARD: "up"}
CLAIM = ("GRPO-style training on a verifiers environment raises its rubric reward (SmolLM2-135M, a SingleTurnEnv "
         "of one-digit sums with a one-function Rubric)")
VERDICT_RULE = rule_text(CLAIMS)
_INTEGER = re.compile(r"-?\d+")


def _rows(held_out: bool) -> list[dict[str, str]]:
    return [{"question": f"What is {a} + {b}? Answer with just the number.", "answer": str(a + b)}
            for a in range(10) for b in range(10) if ((10 * a + b) % 4 == 0) == held_out]


def correct_sum(completion, answer) -> float:
    """1.0 when the last integer of the last reply equals the answer, else 0.0."""
    numbers = _INTEGER.findall(completion[-1].content or "")
    return float(bool(numbers) and numbers[-1] == answer)


def load_environment():
    import verifiers as vf
    from datasets import Dataset

    return vf.SingleTurnEnv(dataset=Dataset.from_list(_rows(False)), eval_dataset=Dataset.from_list(_rows(True)),
                            rubric=vf.Rubric(funcs=[correct_sum], weights=[1.0]))


def get_config(arg: str = "", seed: int = 0) -> Config:
    """The one variant (ARG unused): Dr. GRPO, 4 prompts x 8 samples of <= 12 tokens, lr 2e-5, JAX sampler
    (experiment 4's addition setting, which reached reward >= 0.9 in 8-10 steps, through verifiers)."""
    return Config(
        name=NAME,
        seed=seed,
        run_dir=f"runs/{NAME}_s{seed}",
        total_steps=STEPS,
        model=ModelConfig(source="smollm2"),
        rollout=RolloutConfig(engine="jax", server_dtype="float32", prompts_per_step=4, samples_per_prompt=8,
                              max_tokens=12, temperature=1.0),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=2e-5, warmup_steps=0, micro_batch_size=16, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="verifiers", kwargs={"env_id": "experiments.verifiers_learning:load_environment"}, max_turns=1,
                        eval_size=0),
        checkpoint=CheckpointConfig(every_steps=4, keep=1, async_save=False),
        metrics=MetricsConfig(tensorboard=False, progress_every=1),
    )


def seed_numbers(rewards: Sequence[float]) -> dict[str, float]:
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {REWARD: window_change(rewards), "rubric reward, first 3 steps": mean(rewards[:WINDOW]),
            "rubric reward, last 3 steps": mean(rewards[-WINDOW:])}


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored numbers."""
    return claim_verdict(numbers, CLAIMS)


def deciding_result(per_seed: Mapping[int, Mapping[str, float]], curves: Mapping[int, list], *, setting: str,
                    command: str, wall_s: float, notes: Sequence[str] = ()):
    import json

    from jaxrl_llm.reports.results import ExperimentResult

    numbers, stored = numbers_over_seeds(per_seed)
    return ExperimentResult(
        name=NAME, title="a verifiers environment learns (SmolLM2-135M, SingleTurnEnv of one-digit sums)",
        claim=CLAIM, setting=setting, command=command, seeds=tuple(per_seed),
        statistic="per step the mean rubric reward of the step's episodes; per seed the mean of the last 3 steps "
                  "minus the first 3", interval_method="mean and 95% Student-t over seeds", verdict_rule=VERDICT_RULE,
        verdict=rule_verdict(numbers), headline=REWARD, numbers=numbers, per_seed=stored, wall_s=wall_s,
        notes=(*notes, "rubric reward per step per seed: " + json.dumps(curves)))


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.reports import stats
    from jaxrl_llm.reports.results import write_result
    from jaxrl_llm.reports.runs import experiment_parser, output_dir, run_seeded_experiment, write_summary
    from jaxrl_llm.train.run.metrics import read_metrics

    start = time.perf_counter()
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True).parse_args(argv)
    out = output_dir(args, NAME)
    done = run_seeded_experiment(args, out, ("dr_grpo",), get_config, QUICK)
    per_seed, curves = {}, {}
    for seed in done.seeds:
        rewards = [float(r["reward"]) for r in read_metrics(done.runs[("dr_grpo", seed)] / "metrics.jsonl")]
        per_seed[seed], curves[seed] = seed_numbers(rewards), [round(x, 4) for x in rewards]
    numbers, _ = numbers_over_seeds(per_seed)
    rows = [{"statistic": k, "mean [95% interval] (n)": stats.format_interval(stats.Interval(**v), signed=" - " in k)}
            for k, v in numbers.items()]
    cfg = done.configs[("dr_grpo", done.seeds[0])]
    write_summary(out, rows, ["statistic", "mean [95% interval] (n)"], title=f"verifiers learning ({NAME})",
                  notes=[stats.seed_note(done.seeds, quick=args.quick, full_seeds=len(SEEDS)),
                         f"verdict by the fixed rule: {rule_verdict(numbers)}"],
                  config={"name": NAME, "seeds": list(done.seeds), "config": cfg.to_dict()})
    if args.results:
        setting = (f"{'--quick: ' if args.quick else ''}verifiers SingleTurnEnv (75 one-digit sums, Rubric: last "
                   f"integer == a + b), {cfg.total_steps} steps x {cfg.rollout.prompts_per_step} prompts x "
                   f"{cfg.rollout.samples_per_prompt} samples, <= {cfg.rollout.max_tokens} tokens, {cfg.recipe.name}, "
                   f"lr {cfg.train.lr}, JAX sampler fp32, SmolLM2-135M-Instruct")
        command = "python experiments/verifiers_learning.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        result = deciding_result(per_seed, curves, setting=setting, command=command,
                                 wall_s=time.perf_counter() - start)
        print(f"[experiment] wrote {write_result(result, args.results)}: {result.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
