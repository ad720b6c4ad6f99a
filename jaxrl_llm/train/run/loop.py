"""The RL loop: rollout -> rewards -> advantages/filters -> learner -> weight sync.

`train` first derives the run plan once from the config and the task (`plan.plan_run`:
the recipe, dynamic sampling, environment task, what a checkpoint carries, what it refuses).
One step (`run_step`):

1. The step's prompts are a pure function of (seed, step) (the data position,
   `prompts.step_examples`), so a resumed run sees the same prompts.
2. The sampling stage (`sampling.step_sampling`: a plain batch, dynamic-sampling rounds or
   multi-turn episodes) has the rollout engine (`engines.make_engine`: the JAX sampler in
   process, or vLLM servers) draw G samples per prompt, seeded by (seed, step).
3. Graders score the decoded completions (`grading`; in-process for trusted graders, worker
   processes with timeouts otherwise); a grader that fails scores 0 and is counted.
4. The learner recomputes pi_old, `core.prepare_step_batch` builds advantages,
   filters, corrections and the global aggregation weights per mini-batch, and the
   learner takes epochs x mini-batches optimiser steps (`learn.learn`).
5. The new weights go to the rollout engine (merged, with LoRA).
6. Metrics (JSONL + TensorBoard + W&B with metrics.wandb), the progress bar, and an orbax checkpoint every K
   steps and on SIGTERM. `resume=True` restores the latest checkpoint and continues
   exactly: the RNG of every step derives from (seed, step).

Batches come from an `AsyncRolloutProducer` (async_rollout.py): with rollout.max_lag = 0
it samples step k only after the weights of step k-1 are published (the synchronous
loop); with max_lag = m > 0 it samples m versions ahead while the learner trains, and
the recipe gets token TIS against the staleness (`staleness_corrected`). Resume is exact
for both: a checkpoint carries the batches already sampled by older weights
(`sampled_ahead`), and the resumed producer replays them (one JAX process; with several,
those steps are resampled by the restored weights).

Several JAX processes: each samples and grades its share of the prompts
(`distributed.process_prompt_block`), `run_step` gathers the step batch on every
process, and process 0 alone writes metrics and run_info (all write checkpoints).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any

import jax
import numpy as np

from jaxrl_llm.bridge import CheckpointError
from jaxrl_llm.data import Task
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.rollout.types import RolloutBatch
from jaxrl_llm.train import distributed
from jaxrl_llm.train.run import sampled_ahead
from jaxrl_llm.train.run import step_failure
from jaxrl_llm.train.sample import weight_check
from jaxrl_llm.train.sample.async_rollout import AsyncRolloutProducer, ProducedBatch
from jaxrl_llm.train.run.checkpoint import Checkpointer, install_stop_handler
from jaxrl_llm.train.config import Config
from jaxrl_llm.train.sample.engines import EngineSpec, check_server_urls, engine_spec, engine_weights, make_engine
from jaxrl_llm.train.run.evaluation import PeriodicEval, held_out
from jaxrl_llm.train.sample.grading import Graded, learner_rollouts, response_metrics
from jaxrl_llm.train.learn.step import learn
from jaxrl_llm.train.learn.learner import Learner, LearnerState
from jaxrl_llm.train.run.metrics import GroupLog, MetricsWriter
from jaxrl_llm.train.policy import Policy, load_policy
from jaxrl_llm.train.run.progress import Progress
from jaxrl_llm.train.sample.judge import check_judge, connect_judges
from jaxrl_llm.train.sample.prompts import task_from_config
from jaxrl_llm.train.plan import plan_run
from jaxrl_llm.train.sample.stage import step_sampling
from jaxrl_llm.train.run.teacher import load_teacher
from jaxrl_llm.train.run.tracking import WandbRun, require_wandb
from jaxrl_llm.train.run.run_state import (RunPosition, check_lora_base, checkpoint_state, lora_checkpoint_metadata,
                                       make_learner, position_of)

log = logging.getLogger(__name__)

# Step metrics that depend on the wall clock, not on the computation: left out
# when two runs are compared for exactness.
TIMING_METRICS = ("time_rollout_s", "time_reward_s", "time_wait_s", "time_learn_s", "time_sync_s",
                  "time_step_s", "tokens_per_s", "reward_wall_s", "time_verify_s", "time_verify_wait_s")


@dataclasses.dataclass(frozen=True)
class StepGroups:
    """Per-group arrays of one step, each [P, G], for `GroupLog`."""

    rewards: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray


@dataclasses.dataclass
class TrainResult:
    """Where a run ended: its directory, last step and metrics, the learner state and
    float32 params, the rollout engine's weight version, and the sample ledger's counts."""

    run_dir: str
    step: int
    metrics: dict[str, float]
    state: LearnerState
    params: Any
    engine_version: int
    ledger: dict[str, int]
    eval_summary: dict[str, Any] | None = None  # final and best held-out steps (task.eval_every > 0)


def train(cfg: Config, *, task: Task | None = None, resume: bool = False, policy: Policy | None = None,
          engine=None, wandb: WandbRun | None = None) -> TrainResult:
    """Run (or resume) RL training as configured.

    `task` replaces the configured task (e.g. a user's own Task object), `policy` a
    preloaded model, and `engine` a rollout engine the caller owns (e.g. one that also
    serves evaluations; it must serve `policy`'s weights, and holds the trained weights
    afterwards); by default the loop starts the configured engine and stops it at the end.
    `wandb` is a W&B run the caller owns (tracking.py); by default, with metrics.wandb on,
    the metrics writer opens and finishes its own.
    """
    require_wandb(cfg.metrics)  # a one-line error before any model loads
    distributed.initialize_from_env()  # before any JAX computation; no-op for one process
    distributed.warm_up_collectives()
    run_dir = os.fspath(cfg.run_path)
    os.makedirs(run_dir, exist_ok=True)
    task = task or task_from_config(cfg)  # before the model: a bad task config fails fast
    check_judge(cfg.task.judge)  # a missing judge model too
    plan = plan_run(cfg, task, processes=jax.process_count())  # refuses what the task cannot run
    mesh = distributed.learner_mesh(cfg.mesh)  # refuses sizes the devices cannot hold
    distributed.rollout_mesh(cfg.rollout.mesh)  # the sampler's mesh: refused here too, before any model loads
    spec = engine_spec(cfg)
    if engine is None:
        check_server_urls(spec.rollout)  # a server that does not answer is named before any model loads
    policy = policy or load_policy(cfg.model.source)
    teacher = None if cfg.distill.teacher is None else load_teacher(cfg.distill.teacher, policy)
    learner = make_learner(cfg, policy, plan.recipe, mesh=mesh, teacher=teacher)
    del teacher  # the learner keeps its compute-dtype copy only
    state = learner.init(policy.params, seed=cfg.seed)
    lead = jax.process_index() == 0
    with contextlib.ExitStack() as stack:
        ckpt = stack.enter_context(Checkpointer(cfg.checkpoint_path, every_steps=cfg.checkpoint.every_steps,
                                                keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save))
        state, start = _start_position(ckpt, learner, policy, state, resume=resume, where=cfg.checkpoint_path)
        ckpt_metadata = lora_checkpoint_metadata(learner, policy)  # LoRA: the base's sha256, hashed once
        if start.step >= cfg.total_steps:
            log.info("%s: already at step %d of %d; nothing to do", run_dir, start.step, cfg.total_steps)
            return TrainResult(run_dir, start.step, {}, state, learner.full_params(state.params),
                               start.weight_version, {"produced": 0, "consumed": 0, "dropped": 0})
        writer = stack.enter_context(contextlib.closing(MetricsWriter(
            run_dir, tensorboard=cfg.metrics.tensorboard, resume_step=start.step if resume else None, config=cfg,
            enabled=lead, wandb=wandb)))
        groups = GroupLog(run_dir, resume_step=start.step if resume else None, enabled=lead)
        if engine is None:
            engine = make_engine(spec, policy, engine_weights(spec, learner, state.params),
                                 initial_version=start.weight_version, stack=stack)
        elif start.step:  # resumed: the caller's engine serves the base weights
            engine.update_weights(engine_weights(spec, learner, state.params))
            weight_check.wait_verified(engine)
        pool = stack.enter_context(GraderPool(num_workers=cfg.task.reward_workers, timeout_s=cfg.task.reward_timeout_s))
        connect_judges(cfg.task.judge, task.reward_fn, seed=cfg.seed, run_path=run_dir, stack=stack)  # task.judge
        sampling = step_sampling(cfg, plan, policy, task, pool)
        producer = AsyncRolloutProducer(
            engine, sampling.job, first_step=start.step + 1, last_step=cfg.total_steps, max_lag=cfg.rollout.max_lag,
            sample=sampling.sample, postprocess=sampling.grade,
            replay=sampled_ahead.from_metadata(start.metadata, engine.weight_version))
        setting = held_out(cfg)
        evaluator = PeriodicEval(setting, policy, task, pool, run_path=cfg.run_path, total_steps=cfg.total_steps,
                                 resume_step=start.step if resume else None, enabled=lead)
        stop = stack.enter_context(install_stop_handler())
        progress = stack.enter_context(contextlib.closing(Progress(
            cfg.total_steps, initial=start.step, print_every=cfg.metrics.progress_every,
            keys=("reward", "pass_rate", "length_mean", "time_step_s"))))
        metrics, step, version = {}, start.step, start.weight_version
        with producer:  # closing it records the batches still in flight as dropped
            for step in range(start.step + 1, cfg.total_steps + 1):
                try:
                    metrics, state, step_groups = run_step(spec, producer, learner, state, task)
                    with weight_check.keeping_state(state, version=engine.weight_version):
                        metrics.update(weight_check.wait_verified(engine))  # overlap_verify: this step's push
                except weight_check.PushFailedWithState as failed:  # the servers are wrong, the learner is not
                    version = engine.weight_version + 1 if failed.version is None else failed.version
                    raise step_failure.checkpoint_then_fail(
                        ckpt, failed_step=step, saved_step=step, metadata=ckpt_metadata, err=failed.error,
                        checkpoint=checkpoint_state(failed.state, step, version)) from failed.error
                except Exception as err:  # e.g. a dead server: keep the last finished step, say how to go on
                    if jax.process_count() > 1:
                        raise
                    raise step_failure.checkpoint_then_fail(
                        ckpt, failed_step=step, saved_step=step - 1, metadata=ckpt_metadata, err=err,
                        checkpoint=checkpoint_state(state, step - 1, engine.weight_version)) from err
                if evaluator.due(step):
                    metrics.update(evaluator(step, producer.with_engine))
                version = engine.weight_version
                writer.write(step, metrics)
                if evaluator.last is not None and evaluator.last[0] == step:
                    writer.log_eval(step, evaluator.last[1])
                groups.write(step, step_groups.rewards, step_groups.lengths, step_groups.truncated)
                if lead:
                    progress.update(step, metrics)
                force = step == cfg.total_steps or stop.requested
                if force or ckpt.should_save(step):
                    ahead = (sampled_ahead.to_metadata(producer.unconsumed_batches(), version)
                             if plan.carries_sampled_ahead else {})  # for an exact async resume
                    ckpt.save(step, checkpoint_state(state, step, version), metadata={**ckpt_metadata, **ahead},
                              force=force)
                if stop.requested:
                    log.info("stop requested: checkpoint of step %d written to %s", step, cfg.checkpoint_path)
                    break
        ckpt.wait()
    return TrainResult(run_dir, step, metrics, state, learner.full_params(state.params), version,
                       producer.ledger.counts(), evaluator.summary())


def _start_position(ckpt: Checkpointer, learner: Learner, policy: Policy, state: LearnerState, *, resume: bool,
                    where: os.PathLike) -> tuple[LearnerState, RunPosition]:
    """The state to start from: the latest checkpoint with --resume, else the fresh state
    (refusing a run directory that already holds checkpoints; `where`: its checkpoint path, as the
    config gives it, for the messages)."""
    if not resume:
        if ckpt.latest_step() is not None:
            raise FileExistsError(f"{where} already holds checkpoints; pass --resume to continue "
                                  f"or choose another run_dir")
        return state, RunPosition(0, 0)
    try:
        restored = ckpt.restore_latest(checkpoint_state(state, 0, 0))
    except CheckpointError as err:
        raise CheckpointError(f"--resume: {err}; valid: a run_dir holding a readable checkpoint, or a new run_dir "
                              "without --resume") from err
    if restored is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {where}; valid: a run_dir that holds "
                                "one, or start without --resume")
    check_lora_base(restored.metadata, learner, policy)
    position = dataclasses.replace(position_of(restored.state), metadata=restored.metadata)
    log.info("resumed from step %d (checkpoint %s, weight version %d)", position.step,
             os.path.join(where, str(position.step)), position.weight_version)
    return restored.state["learner"], position


def run_step(spec: EngineSpec, producer: AsyncRolloutProducer, learner: Learner, state: LearnerState,
             task: Task) -> tuple[dict[str, float], LearnerState, StepGroups]:
    """One RL step: the next batch from the producer (sampled and graded), the learner's
    update, and the new weights published to the rollout engine of `spec` (read at set-up)."""
    t0 = time.perf_counter()
    batch: ProducedBatch = producer.next_batch()
    staleness = producer.staleness(batch)  # before this step's publish bumps the learner's version
    t1 = time.perf_counter()
    graded = batch.extra
    rollouts = learner_rollouts(batch.rollouts, graded)  # without ReMax's greedy rows
    if jax.process_count() > 1:
        rollouts, graded = _gather_step(rollouts, graded, batch.context.prompt_width, spec.rollout.max_tokens)
    state, learn_metrics = learn(learner, state, rollouts, graded.step_inputs(task.is_correct),
                                 completion_width=spec.rollout.max_tokens)
    jax.block_until_ready(state.params)
    t2 = time.perf_counter()
    with weight_check.keeping_state(state):  # vLLM: every push is verified by a logprob probe
        producer.publish(engine_weights(spec, learner, state.params))  # LoRA: merged
    t3 = time.perf_counter()
    tokens = sum(r.num_completion_tokens + r.prompt_token_ids.size for r in rollouts.records)
    metrics = {**response_metrics(task, graded.rewards, rollouts, graded.judged), **learn_metrics,
               **graded.sampling, **graded.part_metrics(), "reward_errors": float(graded.errors), "reward_timeouts": float(graded.timeouts),
               "reward_forgery_suspected": float(graded.forgery_suspected),
               "weight_version": float(batch.weight_version), "staleness": float(staleness),
               "time_rollout_s": batch.time_generate_s, "time_reward_s": graded.wall_s, "time_wait_s": t1 - t0,
               "time_learn_s": t2 - t1, "time_sync_s": t3 - t2, "time_step_s": t3 - t0,
               "tokens_per_s": tokens / max(t3 - t0, 1e-9), **weight_check.push_metrics(producer.engine)}
    shape = graded.rewards.shape
    lengths = np.array([r.num_completion_tokens for r in rollouts.records]).reshape(shape)
    truncated = np.array([r.finish_reason != "stop" for r in rollouts.records]).reshape(shape)
    return metrics, state, StepGroups(graded.rewards, lengths, truncated)


def _gather_step(rollouts: RolloutBatch, graded: Graded, prompt_width: int, completion_width: int):
    """Every process's share of the step as the whole step batch (collective)."""
    from jaxrl_llm.train.distributed import allgather_rollouts

    group = graded.rewards.shape[1]  # the graders' and the shaped rewards travel side by side: [P_i, 2G]
    rollouts, both, counts = allgather_rollouts(
        rollouts, np.concatenate([graded.rewards, graded.learner_rewards], axis=1),
        np.array([graded.errors, graded.timeouts, graded.forgery_suspected]), prompt_width=prompt_width,
        completion_width=completion_width)
    return rollouts, Graded(both[:, :group], int(counts[0]), int(counts[1]), graded.wall_s, graded.sampling,
                            both[:, group:], forgery_suspected=int(counts[2]))
