"""Held-out evaluation: pass@1, pass@k (unbiased estimator, Chen et al. 2021, arXiv
2107.03374) and avg@k with the configured rollout engine, at the training temperature.

`evaluate` returns the whole pass@k curve for k = 1..n (n = task.eval_samples) and the
per-sample correctness it came from, so the curve can be recomputed from eval.jsonl.
During training `PeriodicEval` runs it every task.eval_every steps (and at the last
step) on the rollout engine itself, with a fixed seed: the training samples, seeded by
(seed, step), never see it, so a resumed run stays exact.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, Callable

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import EnvTask, Task
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.train.config import Config
from jaxrl_llm.utils.atomic_files import write_text_atomic
from jaxrl_llm.train.sample.engines import make_engine, sampling_params
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes
from jaxrl_llm.train.sample.grading import grade
from jaxrl_llm.train.run.metrics import EVAL_FILE, read_metrics, truncate_metrics
from jaxrl_llm.train.policy import Policy, decode_completions, encode_prompts
from jaxrl_llm.train.sample.prompts import heldout_examples, task_from_config
from jaxrl_llm.train.sample.shaping import distinct_correct, group_classes

log = logging.getLogger(__name__)

EVAL_SUMMARY_FILE = "eval_summary.json"
EVAL_SEED = 12345  # every evaluation draws the same noise: steps are compared on common random numbers


def evaluate(engine, policy: Policy, task: Task, cfg: Config, *, samples: int, seed: int,
             pool: GraderPool | None = None) -> dict[str, Any]:
    """pass@1, pass@k (k = samples) and avg@k on the held-out split (at most
    task.eval_size prompts), the number of distinct correct answers per prompt (classes
    of train/sample/shaping.py's partition), plus three example completions; for an environment
    task also the episodes' means of turns, tool calls, ... (`episode_metrics`)."""
    examples = heldout_examples(task, cfg)
    episode_metrics = {}
    if isinstance(task, EnvTask):  # multi-turn: the episodes' returns (train/sample/episodes.py)
        episodes = run_episodes(engine, policy, task, examples, samples, sampling_params(cfg, seed),
                                EpisodeLimits.from_config(cfg))
        rollouts, rewards, episode_metrics = episodes.rollouts, episodes.rewards, episodes.metrics
        judged = rewards
    else:
        rollouts = engine.generate(encode_prompts(policy, examples), n=samples, params=sampling_params(cfg, seed))
    texts = decode_completions(policy, rollouts)
    if not isinstance(task, EnvTask):
        with contextlib.ExitStack() as stack:
            pool = pool or stack.enter_context(GraderPool(num_workers=1, timeout_s=cfg.task.reward_timeout_s))
            graded = grade(pool, task, texts, examples, samples)
            rewards, judged = graded.rewards, graded.judged  # several task.reward_fns: the first is judged
    correct = np.asarray(task.is_correct(judged), bool)
    curve = pass_at_k_curve(correct)
    shown = [{"prompt": examples[i].prompt, "completion": texts[i * samples], "reward": float(rewards[i, 0])}
             for i in range(min(3, len(examples)))]
    return {"pass@1": curve[0], f"pass@{samples}": curve[-1], f"avg@{samples}": float(rewards.mean()),
            "pass_at_k": curve, "correct": correct.astype(int).tolist(), "num_prompts": len(examples),
            "distinct_correct": distinct_correct(group_classes(cfg, texts, len(examples), samples), correct),
            "examples": shown, **({"episode_metrics": episode_metrics} if episode_metrics else {})}


def pass_at_k_curve(correct) -> list[float]:
    """Mean over prompts of the unbiased pass@k, k = 1..n, from [P, n] per-sample correctness."""
    correct = np.asarray(correct, bool)
    n, counts = correct.shape[1], correct.sum(axis=1)
    return [float(np.mean(core.pass_at_k(np.full_like(counts, n), counts, k))) for k in range(1, n + 1)]


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


class PeriodicEval:
    """Held-out evaluation during training: every task.eval_every steps and at the last step.

    Each evaluation runs on the training rollout engine (through `on_engine`, which holds
    it while no rollout or weight update runs), seeded with EVAL_SEED, appends one record
    to eval.jsonl (the pass@k curve and the per-sample correctness) and returns
    eval_pass@1 / eval_pass@n / eval_avg@n for the step's metrics (JSONL, TensorBoard,
    `jaxrl plot`). Resuming from step k drops eval.jsonl records after k, as the metrics
    writer does. `enabled=False` (JAX processes other than 0) evaluates but writes nothing.
    """

    def __init__(self, cfg: Config, policy: Policy, task: Task, pool: GraderPool, *, resume_step: int | None,
                 enabled: bool = True):
        self.cfg, self.policy, self.task, self.pool, self.enabled = cfg, policy, task, pool, enabled
        self.every = cfg.task.eval_every
        self.last: tuple[int, dict[str, Any]] | None = None  # (step, record) of the latest evaluation
        self.path = os.path.join(cfg.run_path, EVAL_FILE)
        if enabled and resume_step is not None:
            truncate_metrics(self.path, resume_step)

    def due(self, step: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == self.cfg.total_steps)

    def __call__(self, step: int, on_engine: Callable[[Callable[[Any], Any]], Any]) -> dict[str, float]:
        n = self.cfg.task.eval_samples
        result = on_engine(lambda engine: evaluate(engine, self.policy, self.task, self.cfg, samples=n,
                                                    seed=EVAL_SEED, pool=self.pool))
        if self.enabled:
            append_eval(self.cfg, step, result)
        self.last = (step, result)
        return {"eval_pass@1": result["pass@1"], f"eval_pass@{n}": result[f"pass@{n}"],
                f"eval_avg@{n}": result[f"avg@{n}"]}

    def summary(self) -> dict[str, Any] | None:
        """The final and the best (highest pass@1, earliest on ties) evaluated steps of the run,
        written to eval_summary.json and logged; None when nothing was evaluated."""
        if not self.enabled or not self.every or not os.path.exists(self.path):
            return None
        records = [r for r in read_metrics(self.path) if "pass_at_k" in r]
        if not records:
            return None
        best = max(records, key=lambda r: (r["pass@1"], -r["step"]))
        pick = lambda r: {"step": r["step"], "pass@1": r["pass@1"], "pass_at_k": r["pass_at_k"]}
        out = {"final": pick(records[-1]), "best": pick(best)}
        write_text_atomic(self.cfg.run_path / EVAL_SUMMARY_FILE, json.dumps(out, indent=2))
        log.info("held-out pass@1: final %.3f (step %d), best %.3f (step %d)", out["final"]["pass@1"],
                 out["final"]["step"], out["best"]["pass@1"], out["best"]["step"])
        return out
