"""The learner's part of a step: pi_old, the step batch per mini-batch, the optimiser steps.

`learn` recomputes pi_old, then takes epochs x mini-batches optimiser steps. A
mini-batch holds whole prompt groups, and `core.prepare_step_batch` runs per
mini-batch, so every optimiser step's aggregation weights use that step's own global
denominators (docs/objectives.md#masked-mean-micro-batch-bias).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.rollout.types import RolloutBatch
from jaxrl_llm.train.learn.batch import SequenceBatch, build_sequences
from jaxrl_llm.train.learn.critic import critic_metrics
from jaxrl_llm.train.learn.learner import Learner, LearnerState, StepLogprobs
from jaxrl_llm.train.learn import routing_replay


def learn(learner: Learner, state: LearnerState, rollouts: RolloutBatch, sampled: core.StepInputs, *,
          completion_width: int) -> tuple[LearnerState, dict[str, float]]:
    """pi_old recompute, then epochs x mini-batches optimiser steps (see the module doc).

    `sampled` is the sampling stage's part of the step's `core.StepInputs` (`Graded.step_inputs`):
    the learner's (shaped) rewards [P, G]; `correct` [P, G] the graders' verdicts, which the
    zero-variance group filter judges (DAPO filters on accuracy; None: the rewards); and the
    extras the recipe's estimator declares. This adds the learner's part (mask, sampler and pi_old
    log-probs, truncation, reference / teacher log-probs, critic values) and hands each mini-batch
    of the one StepInputs to `core.prepare_step_batch`. The recipe and the train section (mini-batches,
    epochs, reuse of the sampler's log-probs) are the learner's; `completion_width` is rollout.max_tokens.
    The records' routed_experts (MoE policies) go with the sequences (`SequenceBatch.routing`) to both passes
    under train.routing_replay="sampler", and to the routing metrics (`train.learn.routing_replay`).
    """
    core.validate_rewards(sampled.rewards)  # on the host: a NaN reward is an error naming rewards[p, g]
    routing_replay.check_records(rollouts.records, learner.compute_cfg, required=learner.routing_replay == "sampler")
    seq = build_sequences(rollouts, completion_width=completion_width, pad_id=0)
    put = learner.place.replicated
    before = _pi_old(learner, state, seq)
    entropy, ref_logp, teacher_logp = before.entropy, before.ref_logp, before.teacher_logp
    mask = put(seq.completion_mask)
    correct = sampled.rewards if sampled.correct is None else sampled.correct
    inputs = sampled._replace(
        mask=mask, old_logp=before.logp, sampler_logp=seq.sampler_logp, truncated=seq.truncated,
        ref_logp=ref_logp, values=before.values, teacher_logp=teacher_logp, correct=np.asarray(correct, np.float32))
    count = learner.train_cfg.minibatches_per_batch  # the config checks that it divides the prompts
    metrics: dict[str, list] = {}
    prepared = []
    for m in range(count):
        mini = jax.tree.map(lambda x: put(x) if isinstance(x, np.ndarray) else x, core.mini_batch(inputs, m, count))
        batch, prep = _prepare(learner.recipe)(mini)
        rows = batch.mask.shape[0]  # whole prompt groups: P / count prompts x G
        prepared.append((slice(m * rows, (m + 1) * rows), batch))
        for k, v in prep.items():
            metrics.setdefault(k, []).append(float(v))
    for _ in range(learner.train_cfg.epochs_per_batch):
        for rows, batch in prepared:
            state, step_metrics = learner.update(state, _rows(seq, rows), batch)
            for k, v in jax.device_get(step_metrics).items():
                metrics.setdefault(k, []).append(float(v))
    out = {k: float(np.mean(v)) for k, v in metrics.items()}
    out["skipped"] = float(np.sum(metrics.get("skipped", [0.0])))
    if "mismatch_tokens_differing" in metrics:  # a count: summed over the mini-batches
        out["mismatch_tokens_differing"] = float(np.sum(metrics["mismatch_tokens_differing"]))
    if entropy is not None:  # None: pi_old reused from the sampler, no learner pass computed it
        out["entropy"] = float(jnp.sum(entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0))
    if ref_logp is not None:
        out["reference_bytes"] = float(learner.reference_bytes)
    if teacher_logp is not None:
        out["teacher_bytes"] = float(learner.teacher_bytes)
    if learner.compute_cfg.is_moe:
        out.update(routing_replay.routing_metrics(learner.routing_replay, before.routing_differs, mask, out))
    return state, out


def _pi_old(learner: Learner, state: LearnerState, seq: SequenceBatch) -> StepLogprobs:
    """The learner's pi_old pass (entropy, reference log-probs and values with it). With
    train.reuse_sampler_logprobs (rollout.batch_invariant: the sampler's numbers are pi_old's, bit
    for bit) pi_old is the sampler's log-probs, and the pass runs only for a reference, a teacher or a critic."""
    if not learner.train_cfg.reuse_sampler_logprobs:
        return learner.step_logprobs(state.params, seq, critic=state.critic)  # ref_logp / values: None if unused
    sampler_logp = learner.place.replicated(seq.sampler_logp)
    if not learner.needs_reference and state.critic is None and learner.recipe.distill is None:
        return StepLogprobs(sampler_logp, None, None, None, None)
    return learner.step_logprobs(state.params, seq, critic=state.critic)._replace(logp=sampler_logp)


@functools.lru_cache(maxsize=16)
def _prepare(recipe: core.Recipe):
    """`core.prepare_step_batch` of `recipe` as one compiled program. Run op by op, its ~100
    small eager computations on arrays spanning several JAX processes each become a
    cross-process collective, and on CPU (gloo) two processes were seen to deadlock in them."""
    def prepare(inputs: core.StepInputs):
        batch, metrics = core.prepare_step_batch(recipe, inputs)
        if inputs.values is not None:  # the critic's fit at rollout time: explained variance, value/return means
            metrics = {**metrics, **critic_metrics(batch.old_values, batch.returns, batch.mask)}
        return batch, metrics

    return jax.jit(prepare)


def _rows(seq: SequenceBatch, rows: slice) -> SequenceBatch:
    """The rows `rows` of every per-sequence array of `seq`."""
    names = ("tokens", "attention_mask", "positions", "completion_mask", "sampler_logp", "truncated", "routing")
    return seq._replace(**{name: getattr(seq, name)[rows] for name in names if getattr(seq, name) is not None})
