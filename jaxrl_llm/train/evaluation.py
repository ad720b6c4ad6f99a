"""Held-out evaluation: pass@1, pass@k (unbiased estimator, Chen et al. 2021, arXiv
2107.03374) and avg@k with the configured rollout engine, at the training temperature."""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import Task
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.train.config import Config
from jaxrl_llm.train.engines import make_engine, sampling_params
from jaxrl_llm.train.learn import grade
from jaxrl_llm.train.policy import Policy, decode_completions, encode_prompts
from jaxrl_llm.train.prompts import heldout_examples, task_from_config

EVAL_FILE = "eval.jsonl"


def evaluate(engine, policy: Policy, task: Task, cfg: Config, *, samples: int, seed: int,
             pool: GraderPool | None = None) -> dict[str, Any]:
    """pass@1, pass@k (k = samples) and avg@k on the held-out split (at most
    task.eval_size prompts), plus three example completions."""
    examples = heldout_examples(task, cfg)
    rollouts = engine.generate(encode_prompts(policy, examples), n=samples, params=sampling_params(cfg, seed))
    texts = decode_completions(policy, rollouts)
    with contextlib.ExitStack() as stack:
        pool = pool or stack.enter_context(GraderPool(num_workers=1, timeout_s=cfg.task.reward_timeout_s))
        rewards = grade(pool, task, texts, examples, samples).rewards
    correct = task.is_correct(rewards).sum(axis=1)
    shown = [{"prompt": examples[i].prompt, "completion": texts[i * samples], "reward": float(rewards[i, 0])}
             for i in range(min(3, len(examples)))]
    return {"pass@1": float(np.mean([core.pass_at_k(samples, int(c), 1) for c in correct])),
            f"pass@{samples}": float(np.mean([core.pass_at_k(samples, int(c), samples) for c in correct])),
            f"avg@{samples}": float(rewards.mean()), "num_prompts": len(examples), "examples": shown}


def evaluate_params(cfg: Config, policy: Policy, params, *, samples: int | None = None, seed: int = 12345,
                    step: int | None = None, task: Task | None = None) -> dict[str, Any]:
    """Held-out metrics of `params` with a fresh engine of the configured kind; appended to
    <run_dir>/eval.jsonl when `step` is given."""
    samples = samples or cfg.task.eval_samples
    with contextlib.ExitStack() as stack:
        engine = make_engine(cfg, policy, params, stack=stack)
        if cfg.rollout.engine == "vllm" and params is not policy.params:
            engine.update_weights(params)  # the server starts from the base weights
        result = evaluate(engine, policy, task or task_from_config(cfg), cfg, samples=samples, seed=seed)
    if step is not None:
        append_eval(cfg, step, result)
    return result


def append_eval(cfg: Config, step: int, result: dict[str, Any]) -> None:
    """One line {"step": step, **result} appended to <run_dir>/eval.jsonl."""
    os.makedirs(cfg.run_path, exist_ok=True)
    with open(os.path.join(cfg.run_path, EVAL_FILE), "a") as f:
        f.write(json.dumps({"step": step, **result}) + "\n")
