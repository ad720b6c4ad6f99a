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
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import EnvTask, Task
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.train.config import Config, RolloutConfig, ShapingConfig, TaskConfig
from jaxrl_llm.utils.atomic_files import write_text_atomic
from jaxrl_llm.train.sample.engines import engine_spec, make_engine, sampling_params
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes
from jaxrl_llm.train.sample.grading import grade
from jaxrl_llm.train.sample.judge import connect_judges
from jaxrl_llm.train.run.metrics import EVAL_FILE, read_metrics, truncate_metrics
from jaxrl_llm.train.policy import Policy, decode_completions, encode_prompts
from jaxrl_llm.train.sample.prompts import heldout_examples, task_from_config
from jaxrl_llm.train.sample.shaping import distinct_correct, group_classes

log = logging.getLogger(__name__)

EVAL_SUMMARY_FILE = "eval_summary.json"
EVAL_SEED = 12345  # every evaluation draws the same noise: steps are compared on common random numbers


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """What a held-out evaluation reads of a run's config (`held_out`)."""

    task: TaskConfig  # eval_size, eval_samples, eval_every, reward_timeout_s, an episode's limits
    rollout: RolloutConfig  # the sampling parameters; an episode's token budget
    shaping: ShapingConfig  # the partition that counts distinct correct answers
    seed: int  # the run's: the draw of an endless task's held-out prompts


def held_out(cfg: Config) -> HeldOut:
    """The sections of `cfg` that an evaluation reads: read once where a run or an evaluation is set up."""
    return HeldOut(cfg.task, cfg.rollout, cfg.shaping, cfg.seed)


def evaluate(engine, policy: Policy, task: Task, setting: HeldOut, *, samples: int, seed: int,
             pool: GraderPool | None = None) -> dict[str, Any]:
    """pass@1, pass@k (k = samples) and avg@k on the held-out split (at most
    task.eval_size prompts), the number of distinct correct answers per prompt (classes
    of train/sample/shaping.py's partition), plus three example completions; for an environment
    task also the episodes' means of turns, tool calls, ... (`episode_metrics`)."""
    examples = heldout_examples(task, setting.task.eval_size, setting.seed)
    params = sampling_params(setting.rollout, seed)
    episode_metrics = {}
    if isinstance(task, EnvTask):  # multi-turn: the episodes' returns (train/sample/episodes.py)
        episodes = run_episodes(engine, policy, task, examples, samples, params,
                                EpisodeLimits.of(setting.task, setting.rollout.max_tokens))
        rollouts, rewards, episode_metrics = episodes.rollouts, episodes.rewards, episodes.metrics
        judged = rewards
    else:
        rollouts = engine.generate(encode_prompts(policy, examples), n=samples, params=params)
    texts = decode_completions(policy, rollouts)
    if not isinstance(task, EnvTask):
        with contextlib.ExitStack() as stack:
            pool = pool or stack.enter_context(GraderPool(num_workers=1, timeout_s=setting.task.reward_timeout_s))
            graded = grade(pool, task, texts, examples, samples)
            rewards, judged = graded.rewards, graded.judged  # several task.reward_fns: the first is judged
    correct = np.asarray(task.is_correct(judged), bool)
    curve = pass_at_k_curve(correct)
    shown = [{"prompt": examples[i].prompt, "completion": texts[i * samples], "reward": float(rewards[i, 0])}
             for i in range(min(3, len(examples)))]
    classes = group_classes(setting.shaping, texts, len(examples), samples)
    return {"pass@1": curve[0], f"pass@{samples}": curve[-1], f"avg@{samples}": float(rewards.mean()),
            "pass_at_k": curve, "correct": correct.astype(int).tolist(), "num_prompts": len(examples),
            "distinct_correct": distinct_correct(classes, correct),
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
        engine = make_engine(engine_spec(cfg), policy, params, stack=stack)
        if cfg.rollout.engine == "vllm" and params is not policy.params:
            engine.update_weights(params)  # the server starts from the base weights
        task = task or task_from_config(cfg)
        connect_judges(cfg.task.judge, task.reward_fn, seed=cfg.seed, run_path=os.fspath(cfg.run_path), stack=stack)
        result = evaluate(engine, policy, task, held_out(cfg), samples=samples, seed=seed)
    if step is not None:
        append_eval(cfg.run_path, step, result)
    return result


def append_eval(run_path: str | os.PathLike, step: int, result: dict[str, Any]) -> None:
    """One line {"step": step, **result} appended to <run_path>/eval.jsonl."""
    os.makedirs(run_path, exist_ok=True)
    with open(os.path.join(run_path, EVAL_FILE), "a") as f:
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

    def __init__(self, setting: HeldOut, policy: Policy, task: Task, pool: GraderPool, *, run_path: str | os.PathLike,
                 total_steps: int, resume_step: int | None, enabled: bool = True):
        self.setting, self.policy, self.task, self.pool, self.enabled = setting, policy, task, pool, enabled
        self.every, self.total_steps, self.run_path = setting.task.eval_every, total_steps, run_path
        self.last: tuple[int, dict[str, Any]] | None = None  # (step, record) of the latest evaluation
        self.path = os.path.join(run_path, EVAL_FILE)
        if enabled and resume_step is not None:
            truncate_metrics(self.path, resume_step)

    def due(self, step: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == self.total_steps)

    def __call__(self, step: int, on_engine: Callable[[Callable[[Any], Any]], Any]) -> dict[str, float]:
        n = self.setting.task.eval_samples
        result = on_engine(lambda engine: evaluate(engine, self.policy, self.task, self.setting, samples=n,
                                                    seed=EVAL_SEED, pool=self.pool))
        if self.enabled:
            append_eval(self.run_path, step, result)
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
        write_text_atomic(Path(self.run_path) / EVAL_SUMMARY_FILE, json.dumps(out, indent=2))
        log.info("held-out pass@1: final %.3f (step %d), best %.3f (step %d)", out["final"]["pass@1"],
                 out["final"]["step"], out["best"]["pass@1"], out["best"]["step"])
        return out
