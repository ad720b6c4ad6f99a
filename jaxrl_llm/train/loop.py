"""The RL loop: rollout -> rewards -> advantages/filters -> learner -> weight sync.

One step of `train`:

1. The step's prompts are a pure function of (seed, step) (the data position,
   `prompts.step_examples`), so a resumed run sees the same prompts.
2. The rollout engine (`engines.make_engine`: the JAX sampler in process, or vLLM
   servers) draws G samples per prompt, seeded by (seed, step).
3. Graders score the decoded completions (in-process for trusted graders, worker
   processes with timeouts otherwise); a grader that fails scores 0 and is counted.
4. The learner recomputes pi_old, `core.prepare_step_batch` builds advantages,
   filters, corrections and the global aggregation weights per mini-batch, and the
   learner takes epochs x mini-batches optimiser steps (`learn.learn`).
5. The new weights go to the rollout engine (merged, with LoRA).
6. Metrics (JSONL + TensorBoard), the progress bar, and an orbax checkpoint every K
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
from typing import Any, Sequence

import jax
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import TRAIN, EnvTask, Example, Task
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.rollout.types import RolloutBatch
from jaxrl_llm.train import distributed, sampled_ahead, step_failure, vineppo_step, weight_check
from jaxrl_llm.train.async_rollout import AsyncRolloutProducer, ProducedBatch, RolloutJob, staleness_corrected
from jaxrl_llm.train.checkpoint import Checkpointer, install_stop_handler
from jaxrl_llm.train.config import Config, ConfigError
from jaxrl_llm.train.runnable import dynamic_sampling, recipe_from_config
from jaxrl_llm.train.dynamic_sampling import SampledRound, round_seed, sample_until_full
from jaxrl_llm.train.shaping import shape_rewards, with_length_targets
from jaxrl_llm.train.episodes import episode_sampler
from jaxrl_llm.train.engines import engine_params, host_params, make_engine, sampling_params
from jaxrl_llm.train.evaluation import PeriodicEval
from jaxrl_llm.train.learn import Graded, grade, learn, response_metrics
from jaxrl_llm.train.learner import Learner, LearnerState
from jaxrl_llm.train.metrics import GroupLog, MetricsWriter
from jaxrl_llm.train.policy import Policy, decode_completions, encode_prompts, load_policy
from jaxrl_llm.train.progress import Progress
from jaxrl_llm.train.prompts import step_seed, task_from_config
from jaxrl_llm.train.run_state import (RunPosition, check_lora_base, checkpoint_state, lora_checkpoint_metadata,
                                       make_learner, position_of)

log = logging.getLogger(__name__)

# Step metrics that depend on the wall clock, not on the computation: left out
# when two runs are compared for exactness.
TIMING_METRICS = ("time_rollout_s", "time_reward_s", "time_wait_s", "time_learn_s", "time_sync_s",
                  "time_step_s", "tokens_per_s", "reward_wall_s", "time_verify_s", "time_verify_wait_s")


@dataclasses.dataclass(frozen=True)
class StepPrompts:
    """What a step's rollout job carries to its consumer: this process's examples and the
    longest prompt of the whole step (the gather pads to it)."""

    examples: Sequence[Example]
    prompt_width: int
    rounds: tuple = ()  # dynamic sampling: (examples, prompts) of this process's share, per round


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


def check_task_runnable(cfg: Config, task: Task) -> None:
    """The config's checks of environment tasks, on the task actually built: a factory function
    or a `task=` object may turn out to be an environment only here."""
    if not isinstance(task, EnvTask):
        return
    uses = [name for name, on in (("rollout.dynamic_sampling", dynamic_sampling(cfg)),
                                  ("recipe.advantage = 'vineppo'", isinstance(recipe_from_config(cfg).advantage_fn,
                                                                              core.MonteCarloAdvantage)))
            if on]
    if uses:
        raise ConfigError(f"task {task.name!r} is a multi-turn environment, which {uses[0]} does not support; "
                          "valid: a single-turn task, or turn it off")


def train(cfg: Config, *, task: Task | None = None, resume: bool = False, policy: Policy | None = None,
          engine=None) -> TrainResult:
    """Run (or resume) RL training as configured.

    `task` replaces the configured task (e.g. a user's own Task object), `policy` a
    preloaded model, and `engine` a rollout engine the caller owns (e.g. one that also
    serves evaluations; it must serve `policy`'s weights, and holds the trained weights
    afterwards); by default the loop starts the configured engine and stops it at the end.
    """
    distributed.initialize_from_env()  # before any JAX computation; no-op for one process
    distributed.warm_up_collectives()
    run_dir = os.fspath(cfg.run_path)
    os.makedirs(run_dir, exist_ok=True)
    task = task or task_from_config(cfg)  # before the model: a bad task config fails fast
    check_task_runnable(cfg, task)
    policy = policy or load_policy(cfg.model.source)
    recipe = recipe_from_config(cfg)
    if cfg.rollout.max_lag > 0:
        recipe = staleness_corrected(recipe, cfg.recipe.correction_cap or 2.0)
    mesh = distributed.global_mesh(cfg.mesh) if jax.device_count() > 1 else None
    learner = make_learner(cfg, policy, recipe=recipe, mesh=mesh)
    state = learner.init(policy.params, seed=cfg.seed)
    lead = jax.process_index() == 0
    with contextlib.ExitStack() as stack:
        ckpt = stack.enter_context(Checkpointer(cfg.checkpoint_path, every_steps=cfg.checkpoint.every_steps,
                                                keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save))
        state, start = _start_position(cfg, ckpt, learner, policy, state, resume=resume)
        if start.step >= cfg.total_steps:
            log.info("%s: already at step %d of %d; nothing to do", run_dir, start.step, cfg.total_steps)
            return TrainResult(run_dir, start.step, {}, state, learner.full_params(state.params),
                               start.weight_version, {"produced": 0, "consumed": 0, "dropped": 0})
        writer = stack.enter_context(contextlib.closing(MetricsWriter(
            run_dir, tensorboard=cfg.metrics.tensorboard, resume_step=start.step if resume else None, config=cfg,
            enabled=lead)))
        groups = GroupLog(run_dir, resume_step=start.step if resume else None, enabled=lead)
        if engine is None:
            engine = make_engine(cfg, policy, host_params(learner.full_params(state.params)),
                                 initial_version=start.weight_version, stack=stack)
        elif start.step:  # resumed: the caller's engine serves the base weights
            engine.update_weights(engine_params(cfg, host_params(learner.full_params(state.params))))
            weight_check.wait_verified(engine)
        pool = stack.enter_context(GraderPool(num_workers=cfg.task.reward_workers, timeout_s=cfg.task.reward_timeout_s))
        producer = _producer(cfg, engine, policy, task, pool, first_step=start.step + 1,
                             replay=sampled_ahead.from_metadata(start.metadata, engine.weight_version))
        evaluator = PeriodicEval(cfg, policy, task, pool, resume_step=start.step if resume else None, enabled=lead)
        stop = stack.enter_context(install_stop_handler())
        progress = stack.enter_context(contextlib.closing(Progress(
            cfg.total_steps, initial=start.step, print_every=cfg.metrics.progress_every,
            keys=("reward", "pass_rate", "length_mean", "time_step_s"))))
        metrics, step, version = {}, start.step, start.weight_version
        ckpt_metadata = lora_checkpoint_metadata(learner, policy)  # LoRA: the base's sha256, hashed once
        with producer:  # closing it records the batches still in flight as dropped
            for step in range(start.step + 1, cfg.total_steps + 1):
                try:
                    metrics, state, step_groups = run_step(cfg, producer, recipe, learner, state, task)
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
                groups.write(step, step_groups.rewards, step_groups.lengths, step_groups.truncated)
                if lead:
                    progress.update(step, metrics)
                force = step == cfg.total_steps or stop.requested
                if force or ckpt.should_save(step):
                    # Batches sampled ahead are carried for an exact async resume; not with several
                    # processes, nor with dynamic sampling (its rows come from several prompt rounds).
                    # Nor with an environment task (its batches are resampled, exactly with max_lag = 0).
                    carry = jax.process_count() == 1 and not dynamic_sampling(cfg) and not isinstance(task, EnvTask)
                    ahead = sampled_ahead.to_metadata(producer.unconsumed_batches(), version) if carry else {}
                    ckpt.save(step, checkpoint_state(state, step, version), metadata={**ckpt_metadata, **ahead},
                              force=force)
                if stop.requested:
                    log.info("stop requested: checkpoint of step %d written to %s", step, cfg.checkpoint_path)
                    break
        ckpt.wait()
    return TrainResult(run_dir, step, metrics, state, learner.full_params(state.params), version,
                       producer.ledger.counts(), evaluator.summary())


def _start_position(cfg: Config, ckpt: Checkpointer, learner: Learner, policy: Policy, state: LearnerState, *,
                    resume: bool) -> tuple[LearnerState, RunPosition]:
    """The state to start from: the latest checkpoint with --resume, else the fresh state
    (refusing a run directory that already holds checkpoints)."""
    if not resume:
        if ckpt.latest_step() is not None:
            raise FileExistsError(f"{cfg.checkpoint_path} already holds checkpoints; pass --resume to continue "
                                  f"or choose another run_dir")
        return state, RunPosition(0, 0)
    restored = ckpt.restore_latest(checkpoint_state(state, 0, 0))
    if restored is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {cfg.checkpoint_path}; valid: a run_dir that holds "
                                "one, or start without --resume")
    check_lora_base(restored.metadata, learner, policy)
    position = dataclasses.replace(position_of(restored.state), metadata=restored.metadata)
    log.info("resumed from step %d (checkpoint %s, weight version %d)", position.step,
             os.path.join(cfg.checkpoint_path, str(position.step)), position.weight_version)
    return restored.state["learner"], position


def _producer(cfg: Config, engine, policy: Policy, task: Task, pool: GraderPool, *,
              first_step: int, replay=None) -> AsyncRolloutProducer:
    """The batch source of steps first_step..total_steps: sampled and graded (this process's
    share of the prompts) in the producer thread."""
    block = distributed.process_prompt_block(cfg.rollout.prompts_per_step)
    group = cfg.rollout.samples_per_prompt

    rounds = cfg.rollout.dynamic_sampling_rounds if dynamic_sampling(cfg) else 1

    def make_job(step: int) -> RolloutJob:
        seeds = [round_seed(step_seed(cfg, step), r) for r in range(rounds)]
        drawn = [with_length_targets(cfg, task.examples(TRAIN, cfg.rollout.prompts_per_step, seed=seed), seed)
                 for seed in seeds]  # round 0 = step_examples(task, cfg, step)
        encoded = [encode_prompts(policy, examples) for examples in drawn]
        params = dataclasses.replace(sampling_params(cfg, seed=step_seed(cfg, step)),
                                     first_row=block.start * group)  # the samples of an unsplit batch
        width = max(len(p) for prompts in encoded for p in prompts)
        return RolloutJob(step, encoded[0][block], group, params, StepPrompts(
            drawn[0][block], width, tuple((e[block], p[block]) for e, p in zip(drawn, encoded))))

    def shaped(graded: Graded, rollouts: RolloutBatch, texts, examples) -> Graded:
        lengths = np.array([r.num_completion_tokens for r in rollouts.records]).reshape(graded.rewards.shape)
        out = shape_rewards(cfg, task, graded.rewards, texts, lengths, examples, base=graded.learner_rewards)
        return dataclasses.replace(graded, shaped=out.rewards, sampling={**graded.sampling, **out.metrics})

    vine = vineppo_step.vine_values(cfg, policy, task, pool)  # None unless the recipe's advantage is vineppo

    def grade_job(job: RolloutJob, rollouts: RolloutBatch) -> Graded:  # runs in the producer thread
        texts = decode_completions(policy, rollouts)
        graded = shaped(grade(pool, task, texts, job.context.examples, job.n), rollouts, texts, job.context.examples)
        if vine is not None:  # K continuations per chunk start, drawn by the weights that drew `rollouts`
            graded = producer.with_engine(lambda e: vine.attach(e, rollouts, graded, job.context.examples, job.params))
        return graded

    def sample_rounds(engine, job: RolloutJob) -> tuple[RolloutBatch, Graded]:  # dynamic sampling
        def one_round(r: int) -> SampledRound:
            examples, prompts = job.context.rounds[r]
            rollouts = engine.generate(prompts, n=job.n, params=dataclasses.replace(
                job.params, seed=round_seed(job.params.seed, r)))
            graded = grade(pool, task, decode_completions(policy, rollouts), examples, job.n)
            return SampledRound(rollouts, graded.rewards, graded)

        filled, drawn = sample_until_full(one_round, task.is_correct, max_rounds=rounds)
        graded = Graded(filled.rewards, sum(r.extra.errors for r in drawn), sum(r.extra.timeouts for r in drawn),
                        sum(r.extra.wall_s for r in drawn), filled.metrics)
        examples = [job.context.rounds[r][0][p] for r, p in filled.source]
        return filled.rollouts, shaped(graded, filled.rollouts, decode_completions(policy, filled.rollouts), examples)

    def sample_episodes(engine, job: RolloutJob) -> tuple[RolloutBatch, Graded]:  # multi-turn environments
        rollouts, graded = episode_sampler(cfg, policy, task)(engine, job)
        return rollouts, shaped(graded, rollouts, decode_completions(policy, rollouts), job.context.examples)

    sample = sample_rounds if dynamic_sampling(cfg) else sample_episodes if isinstance(task, EnvTask) else None
    producer = AsyncRolloutProducer(engine, make_job, first_step=first_step, last_step=cfg.total_steps,
                                    max_lag=cfg.rollout.max_lag, postprocess=grade_job, sample=sample, replay=replay)
    return producer


def run_step(cfg: Config, producer: AsyncRolloutProducer, recipe: core.Recipe, learner: Learner,
             state: LearnerState, task: Task) -> tuple[dict[str, float], LearnerState, StepGroups]:
    """One RL step: the next batch from the producer (sampled and graded), the learner's
    update, and the new weights published to the rollout engine."""
    t0 = time.perf_counter()
    batch: ProducedBatch = producer.next_batch()
    staleness = producer.staleness(batch)  # before this step's publish bumps the learner's version
    t1 = time.perf_counter()
    rollouts, graded = batch.rollouts, batch.extra
    if jax.process_count() > 1:
        rollouts, graded = _gather_step(cfg, rollouts, graded, batch.context.prompt_width)
    state, learn_metrics = learn(learner, state, recipe, cfg, rollouts, graded.learner_rewards,
                                 correct=task.is_correct(graded.rewards), advantages=graded.advantages)
    jax.block_until_ready(state.params)
    t2 = time.perf_counter()
    with weight_check.keeping_state(state):  # vLLM: every push is verified by a logprob probe
        producer.publish(engine_params(cfg, host_params(learner.full_params(state.params))))  # LoRA: merged
    t3 = time.perf_counter()
    tokens = sum(r.num_completion_tokens + r.prompt_token_ids.size for r in rollouts.records)
    metrics = {**response_metrics(task, graded.rewards, rollouts), **learn_metrics,
               **graded.sampling, "reward_errors": float(graded.errors), "reward_timeouts": float(graded.timeouts),
               "weight_version": float(batch.weight_version), "staleness": float(staleness),
               "time_rollout_s": batch.time_generate_s, "time_reward_s": graded.wall_s, "time_wait_s": t1 - t0,
               "time_learn_s": t2 - t1, "time_sync_s": t3 - t2, "time_step_s": t3 - t0,
               "tokens_per_s": tokens / max(t3 - t0, 1e-9), **weight_check.push_metrics(producer.engine)}
    shape = graded.rewards.shape
    lengths = np.array([r.num_completion_tokens for r in rollouts.records]).reshape(shape)
    truncated = np.array([r.finish_reason != "stop" for r in rollouts.records]).reshape(shape)
    return metrics, state, StepGroups(graded.rewards, lengths, truncated)


def _gather_step(cfg: Config, rollouts: RolloutBatch, graded: Graded, prompt_width: int):
    """Every process's share of the step as the whole step batch (collective)."""
    from jaxrl_llm.train.distributed import allgather_rollouts

    group = graded.rewards.shape[1]  # the graders' and the shaped rewards travel side by side: [P_i, 2G]
    rollouts, both, counts = allgather_rollouts(
        rollouts, np.concatenate([graded.rewards, graded.learner_rewards], axis=1),
        np.array([graded.errors, graded.timeouts]), prompt_width=prompt_width, completion_width=cfg.rollout.max_tokens)
    return rollouts, Graded(both[:, :group], int(counts[0]), int(counts[1]), graded.wall_s, graded.sampling,
                            both[:, group:])
