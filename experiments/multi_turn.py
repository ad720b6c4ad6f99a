"""Multi-turn RL on the two built-in environments with SmolLM2-135M-Instruct (CPU-sized).

  calculator_tool  2-digit addition; the model may call <calc>EXPR</calc> and gets
                   <result>VALUE</result>; reward 1 for the right final answer
                   (16 held-out questions x 4 episodes).
  guess_number     a secret from 1 to 5 with higher/lower hints; reward 1 when guessed
                   within 4 turns (held-out secrets 1 and 4, 32 episodes each).

Both sized so that the base model succeeds sometimes (at temperature 0.7), so Dr. GRPO
groups have reward variance from the first step. Held-out success (solved episodes of
the held-out prompts, same evaluation seed) before and after a short run (10 steps of
4 prompts x 8 episodes, lr 5e-5), on one engine (the in-process JAX sampler;
rollout.engine=vllm for the server) that first serves the base weights and then trains:

    python -m experiments.multi_turn guess_number [dotted.overrides=...]
    python -m experiments.multi_turn calculator_tool rollout.engine=vllm
    jaxrl train --config experiments/multi_turn.py:guess_number      # training only
    jaxrl eval --config experiments/multi_turn.py:guess_number --step 10   # its final checkpoint

Writes <run_dir>/before_after.json: solved/episodes before and after, the episodes'
turns, tool calls and tool errors (invalid moves in guess_number), and a two-proportion
test of the change.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time

from jaxrl_llm.train.config import (CheckpointConfig, Config, MetricsConfig, ModelConfig, RecipeConfig, RolloutConfig,
                                    TaskConfig, TrainConfig, apply_overrides)

ENVS = {
    # 2-digit addition: the base model answers 1 in 8 right at temperature 0.7 and never calls the tool.
    "calculator_tool": dict(task=TaskConfig(name="calculator_tool", kwargs={"digits": 2, "ops": "+"},
                                            max_turns=2, turn_max_tokens=24, eval_size=16, eval_samples=4),
                            max_tokens=64, steps=10),
    # secrets 1..5 (held out: 1 and 4); the base model answers with a number ~1 move in 3.
    "guess_number": dict(task=TaskConfig(name="guess_number", kwargs={"max_number": 5, "heldout_fraction": 0.5},
                                         max_turns=4, turn_max_tokens=4, eval_size=0, eval_samples=32),
                         max_tokens=56, steps=10),
}


def get_config(env: str = "guess_number") -> Config:
    if env not in ENVS:
        raise ValueError(f"unknown environment {env!r}; valid: {', '.join(ENVS)}")
    spec = ENVS[env]
    return Config(
        name=f"multi_turn_{env}",
        seed=0,
        run_dir=f"runs/multi_turn_{env}",
        total_steps=spec["steps"],
        model=ModelConfig(source="smollm2"),
        rollout=RolloutConfig(engine="jax", server_dtype="float32", prompts_per_step=4, samples_per_prompt=8,
                              max_tokens=spec["max_tokens"], temperature=0.7),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=5e-5, warmup_steps=0, micro_batch_size=4, precision="fp32", grad_clip=1.0),
        task=spec["task"],
        checkpoint=CheckpointConfig(every_steps=0, keep=1),
        metrics=MetricsConfig(tensorboard=False, progress_every=1),
    )


def two_proportions(k1: int, n1: int, k2: int, n2: int) -> dict:
    """Difference of two success rates p2 - p1 with its 95% Wald interval and the two-sided
    p-value of the pooled two-proportion z-test (episodes treated as independent)."""
    p1, p2 = k1 / n1, k2 / n2
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    pooled = (k1 + k2) / (n1 + n2)
    se0 = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    z = (p2 - p1) / se0 if se0 > 0 else 0.0
    return {"diff": p2 - p1, "ci95": [p2 - p1 - 1.96 * se, p2 - p1 + 1.96 * se], "z": z,
            "p_value": math.erfc(abs(z) / math.sqrt(2))}


def _summary(result: dict) -> dict:
    correct = [c for row in result["correct"] for c in row]
    return {"solved": int(sum(correct)), "episodes": len(correct), "pass@1": result["pass@1"],
            **result.get("episode_metrics", {})}


def main(env: str, overrides: list[str]) -> dict:
    """Held-out success before and after training, on the same engine and evaluation seed
    (solved episodes out of held-out prompts x task.eval_samples, a two-proportion test, and
    the episodes' turns / tool calls / tool errors); written to <run_dir>/before_after.json."""
    from jaxrl_llm.train.run import loop
    from jaxrl_llm.train.sample.engines import engine_spec, make_engine
    from jaxrl_llm.train.run.evaluation import EVAL_SEED, evaluate, held_out
    from jaxrl_llm.train.policy import load_policy
    from jaxrl_llm.train.sample.prompts import task_from_config

    start = time.perf_counter()
    cfg = apply_overrides(get_config(env), overrides)
    policy = load_policy(cfg.model.source)
    task = task_from_config(cfg)
    with contextlib.ExitStack() as stack:
        engine = make_engine(engine_spec(cfg), policy, policy.params, stack=stack)
        before = _summary(evaluate(engine, policy, task, held_out(cfg), samples=cfg.task.eval_samples, seed=EVAL_SEED))
        print(f"before: {before}", flush=True)
        result = loop.train(cfg, task=task, policy=policy, engine=engine)
        after_full = evaluate(engine, policy, task, held_out(cfg), samples=cfg.task.eval_samples, seed=EVAL_SEED)
    after = _summary(after_full)
    out = {"env": env, "overrides": overrides, "steps": result.step, "before": before, "after": after,
           "test": two_proportions(before["solved"], before["episodes"], after["solved"], after["episodes"]),
           "wall_s": time.perf_counter() - start, "load_average": os.getloadavg(),
           "final_train_metrics": result.metrics, "examples_after": after_full["examples"]}
    with open(os.path.join(cfg.run_path, "before_after.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "examples_after"}, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
