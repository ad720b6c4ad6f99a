"""The learner: one jit-compiled, micro-batched, optionally sharded optimiser step.

* Loss: `core.recipe_loss` on a `core.StepBatch` whose aggregation weights
  were fixed on the whole optimiser-step batch (`core.prepare_step_batch`),
  so the micro-batch losses are plain sums and accumulating their gradients
  equals one pass over the batch (docs/objectives.md#masked-mean-micro-batch-bias).
* Precision: fp32 master weights and optimiser state always; the forward and
  backward run in the compute dtype of `TrainConfig.precision` (fp32, bf16,
  fp16), log-softmax in float32 (docs/objectives.md#precision). fp16 uses dynamic loss
  scaling: on a non-finite gradient the step is skipped and the scale halved;
  after `loss_scale_growth_interval` good steps it doubles (Micikevicius et
  al. 2018, "Mixed Precision Training"). In every precision a non-finite loss
  or gradient skips the update and is reported as `skipped`.
* Optimiser: optax AdamW behind global-norm clipping, with a warmup + constant
  / linear / cosine learning-rate schedule.
* Sharding: with a mesh, params follow `models.param_shardings` and batch rows
  are split over ("data", "fsdp"); jit (GSPMD) inserts the collectives.
* LoRA (`train.lora_rank` >= 1; Hu et al. 2021, `models.lora`): the trainable
  tree (`LearnerState.params`, gradients, optimiser state, checkpoints) is the
  adapters; the float32 base weights are frozen in `Learner.frozen` (set by
  `init`) and enter every jitted function as an argument. The forward uses
  `lora.merge(frozen, adapters)`, recomputed in every micro-batch's loss (one
  [in, r] x [r, out] product per matrix, cheap at this model size; the backward
  still forms each full dL/dW before projecting it onto A and B, so LoRA saves
  optimiser state and work, not backward FLOPs). `full_params` gives the
  merged weights that the rollout engines receive.
* Reference policy (recipe.kl_beta > 0; `train.reference`): `step_logprobs` returns
  the reference log-probs next to pi_old from the same micro-batched program; the
  reference is a compute-dtype copy of the initial params, or with LoRA the frozen base.
* Critic (recipes with GAE advantages, e.g. ppo; `train.critic`): a value head on the
  trunk's hidden states, evaluated in the same forward as the policy's logprobs (values
  at rollout time from `step_logprobs`, current values in every micro-batch's loss), and
  updated with its own optimiser in the same step (`LearnerState.critic`).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm import core
from jaxrl_llm.models import (DecoderConfig, batch_sharding, chunked_logprobs_from_hidden, forward, lora,
                              param_shardings)
from jaxrl_llm.models.compile_options import learner_compiler_options
from jaxrl_llm.models.remat import remat_mode
from jaxrl_llm.train import critic as critic_lib
from jaxrl_llm.train import reference as reference_lib
from jaxrl_llm.train.batch import SequenceBatch

PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class LossScale(NamedTuple):
    scale: jax.Array  # float32 scalar
    good_steps: jax.Array  # int32 scalar: finite steps since the last change


def _put(tree, shardings):
    """jax.device_put that also works with several JAX processes: there a sharding spans
    other processes' devices and JAX places only host values (identical on every process)
    or arrays already spread over the mesh, so process-local arrays go through the host."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(x, sharding):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)  # already global: a reshard
        host = np.asarray(x)  # each process fills its own devices' shards, no cross-process check
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: one(x, shardings), tree)
    return jax.tree.map(one, tree, shardings)


class StepLogprobs(NamedTuple):
    """The learner's pass over a step batch before its updates, each float32 [N, T_c]."""

    logp: jax.Array  # pi_old
    entropy: jax.Array
    ref_logp: jax.Array | None  # the reference policy's; None without one
    values: jax.Array | None = None  # the critic's V_t; None without one


class LearnerState(NamedTuple):
    params: Any  # float32 master weights
    opt_state: Any
    loss_scale: LossScale
    step: jax.Array  # int32: optimiser steps taken (skipped ones included)
    critic: critic_lib.CriticState | None = None  # the value head and its optimiser state


def learning_rate_schedule(train_cfg, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 over warmup_steps, then constant, linear decay to 0 or cosine decay to 0."""
    warmup = int(train_cfg.warmup_steps)
    decay_steps = max(int(total_steps) - warmup, 1)
    if train_cfg.schedule == "constant":
        after = optax.constant_schedule(train_cfg.lr)
    elif train_cfg.schedule == "linear":
        after = optax.linear_schedule(train_cfg.lr, 0.0, decay_steps)
    elif train_cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(train_cfg.lr, decay_steps)
    else:
        raise ValueError(f"train.schedule={train_cfg.schedule!r}; valid: 'constant', 'linear', 'cosine'")
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, train_cfg.lr, warmup), after], [warmup])


def make_optimizer(train_cfg, total_steps: int) -> optax.GradientTransformation:
    parts = [] if train_cfg.grad_clip is None else [optax.clip_by_global_norm(train_cfg.grad_clip)]
    parts.append(optax.adamw(learning_rate_schedule(train_cfg, total_steps), b1=train_cfg.adam_b1,
                             b2=train_cfg.adam_b2, eps=train_cfg.adam_eps, weight_decay=train_cfg.weight_decay))
    return optax.chain(*parts)


def _split_rows(x, num_micro_batches: int):
    """[N, ...] -> [k, N/k, ...] with micro-batch i = rows i, i+k, i+2k, ...: a strided split, so
    with rows sharded in contiguous blocks every micro-batch stays spread over all devices.
    Any row partition gives the same sum, because the weights are global."""
    if x is None:
        return None
    rows = x.shape[0]
    return jnp.swapaxes(x.reshape(rows // num_micro_batches, num_micro_batches, *x.shape[1:]), 0, 1)


def _completion_logprobs(params, cfg: DecoderConfig, tokens, attention_mask, positions, *, prompt_width: int,
                         completion_width: int, temperature: float, return_entropy: bool, remat: str,
                         critic_params=None):
    """Logprobs (and entropies) of the completion tokens only: the LM head and
    log-softmax run on the T_c completion positions, not on the prompt (the LM head
    is ~1/5 of SmolLM2's FLOPs per position, so this is not free). With `critic_params`,
    also the value head's V_t on the same hidden states: (logprob output, values)."""
    hidden, _ = forward(params, cfg, tokens, positions=positions, attention_mask=attention_mask,
                        return_hidden=True, remat=remat)
    predicting = jax.lax.slice_in_dim(hidden, prompt_width - 1, prompt_width - 1 + completion_width, axis=1)
    targets = jax.lax.slice_in_dim(tokens, prompt_width, prompt_width + completion_width, axis=1)
    out = chunked_logprobs_from_hidden(predicting, targets, params, cfg, temperature=temperature,
                                       return_entropy=return_entropy)
    if critic_params is None:
        return out
    return out, critic_lib.head_values(critic_params, predicting)


class Learner:
    """Holds the static pieces of a run (model config, recipe, optimiser, mesh)
    and exposes two jitted functions: `logprobs` (pi_old recompute, entropy) and
    `update` (one optimiser step on one StepBatch)."""

    def __init__(self, model_cfg: DecoderConfig, recipe: core.Recipe, train_cfg, *, total_steps: int,
                 temperature: float = 1.0, mesh: jax.sharding.Mesh | None = None, critic_cfg=None):
        if train_cfg.precision not in PRECISION_DTYPES:
            raise ValueError(f"train.precision={train_cfg.precision!r}; valid: {sorted(PRECISION_DTYPES)}")
        dtype = PRECISION_DTYPES[train_cfg.precision]
        self.compute_cfg = model_cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype)
        self.compute_dtype = jnp.dtype(dtype)
        self.recipe = recipe
        self.train_cfg = train_cfg
        self.temperature = float(temperature)
        self.mesh = mesh
        self.remat = remat_mode(train_cfg.remat)
        self.dynamic_loss_scale = train_cfg.precision == "fp16"
        self.optimizer = make_optimizer(train_cfg, total_steps)
        self.lora = lora.spec_from_train_config(train_cfg)  # None: full fine-tuning
        self.frozen = None  # LoRA: the float32 base params, set by init
        self.needs_reference = recipe.kl_beta > 0
        self.reference = None  # full fine-tuning with a KL term: the compute-dtype initial params, set by init
        self.needs_critic = isinstance(recipe.advantage_fn, core.GaeAdvantage) or recipe.value_coef > 0
        if self.needs_critic and (critic_cfg is None or recipe.value_coef <= 0):
            raise ValueError(f"recipe {recipe.name!r} needs a critic: pass critic_cfg (the config's critic "
                             f"section) and a recipe with value_coef > 0 (got {recipe.value_coef})")
        self.critic_cfg = critic_cfg
        self.critic_optimizer = critic_lib.make_critic_optimizer(critic_cfg) if self.needs_critic else None
        self._merge = jax.jit(self._full_params_impl)
        options = learner_compiler_options(self.compute_dtype, jax.default_backend())  # XLA:CPU fusion
        self._logprobs = jax.jit(self._logprobs_impl, static_argnames=("prompt_width", "num_micro_batches",
                                                                       "with_reference"), compiler_options=options)
        # No buffer donation: the JAX sampler may hold the same float32 params buffers.
        self._update = jax.jit(self._update_impl, static_argnames=("prompt_width", "num_micro_batches"),
                               compiler_options=options)
        self._grads = jax.jit(self._grads_impl, static_argnames=("prompt_width", "num_micro_batches"),
                              compiler_options=options)

    # ----------------------------------------------------------------- state
    def init(self, params, *, seed: int = 0) -> LearnerState:
        """State for training `params` (full fine-tuning), or, with LoRA, fresh adapters
        (A from PRNGKey(seed), B = 0) on the frozen `params`, which become `self.frozen`."""
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
        if self.needs_reference and self.lora is None:  # with LoRA the frozen base is the reference
            placed = params if self.mesh is None else _put(params, param_shardings(params, self.mesh))
            self.reference = reference_lib.reference_copy(placed, self.compute_dtype)
        if self.lora is not None:
            self.frozen = params if self.mesh is None else _put(params, param_shardings(params, self.mesh))
            params = lora.init_adapters(params, self.lora, jax.random.PRNGKey(seed))
        scale = self.train_cfg.loss_scale_init if self.dynamic_loss_scale else 1.0
        scalars = (LossScale(jnp.float32(scale), jnp.int32(0)), jnp.int32(0))
        critic = None
        if self.needs_critic:
            head = critic_lib.init_critic_params(self.compute_cfg.hidden_size)
            critic = critic_lib.CriticState(head, self.critic_optimizer.init(head))
        if self.mesh is None:
            return LearnerState(params, self.optimizer.init(params), *scalars, critic)
        # Everything lives on the mesh: optimiser moments take their parameter's sharding,
        # other optimiser leaves (step counts) and the scalars are replicated.
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        if self.lora is None:
            shardings = param_shardings(params, self.mesh)
        else:  # adapters are small: replicated on every device
            shardings = jax.tree.map(lambda _: replicated, params)
        params = _put(params, shardings)
        opt_state = optax.tree_utils.tree_map_params(
            self.optimizer, _put, self.optimizer.init(params), shardings,
            transform_non_params=lambda x: _put(x, replicated))
        return LearnerState(params, opt_state, *_put(scalars, replicated), _put(critic, replicated))

    def compute_params(self, params, frozen=None):
        """Master params (LoRA: adapters merged into `frozen`) cast to the compute dtype
        (what the forward pass sees)."""
        if frozen is not None:
            params = lora.merge(frozen, params, self.lora.scale)
        return jax.tree.map(lambda x: x.astype(self.compute_dtype), params)

    def full_params(self, params):
        """Float32 full params for the rollout engine / export: `params` itself, or with
        LoRA the adapters merged into the frozen base (W + alpha/r * A @ B)."""
        return params if self.lora is None else self._merge(self.frozen, params)

    @property
    def reference_bytes(self) -> int:
        """Extra memory the reference policy costs: its copy of the weights in the compute
        dtype, or 0 (no KL term, or LoRA, whose frozen base is the reference)."""
        return reference_lib.tree_bytes(self.reference)

    def _full_params_impl(self, frozen, adapters):
        return lora.merge(frozen, adapters, self.lora.scale)

    def _num_micro_batches(self, rows: int) -> int:
        size = min(self.train_cfg.micro_batch_size, rows)
        if rows % size:
            raise ValueError(f"train.micro_batch_size={self.train_cfg.micro_batch_size} must divide the "
                             f"{rows} sequences of an optimiser step")
        return rows // size

    def replicated(self, x) -> jax.Array:
        """A host array as a JAX array that can meet the learner's arrays in one computation:
        plain with one process; with several, replicated over the global mesh."""
        if jax.process_count() == 1 or self.mesh is None:
            return jnp.asarray(x)
        return _put(x, jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()))

    def _place(self, tree):
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, tree)
        return jax.tree.map(lambda x: _put(x, batch_sharding(self.mesh, np.ndim(x))), tree)

    # -------------------------------------------------------------- logprobs
    def logprobs(self, params, seq: SequenceBatch) -> tuple[jax.Array, jax.Array]:
        """(logp, entropy), each float32 [N, T_c]: the learner's pi_old of the
        completion tokens at the sampling temperature, and the entropy of its
        next-token distribution there. No gradient; micro-batched."""
        out = self.step_logprobs(params, seq, with_reference=False)
        return out.logp, out.entropy

    def step_logprobs(self, params, seq: SequenceBatch, *, with_reference: bool | None = None,
                      critic: critic_lib.CriticState | None = None) -> StepLogprobs:
        """pi_old, entropy, (with_reference; default: when the recipe has a KL term) the
        reference policy's log-probs and (given the `critic`) its values, all from one
        jitted, micro-batched pass: each micro-batch runs the policy's forward (the value
        head reads its hidden states) and then the reference's."""
        with_reference = self.needs_reference if with_reference is None else with_reference
        if with_reference and self.reference is None and self.frozen is None:
            raise ValueError("no reference policy: the learner keeps one when recipe.kl_beta > 0 (or with LoRA, "
                             "whose frozen base is the reference); call init first")
        arrays = self._place((seq.tokens, seq.attention_mask, seq.positions))
        critic_params = None if critic is None else critic.params
        return self._logprobs(params, self.frozen, self.reference, critic_params, *arrays, prompt_width=seq.prompt_width,
                              num_micro_batches=self._num_micro_batches(seq.tokens.shape[0]),
                              with_reference=with_reference)

    def _logprobs_impl(self, params, frozen, reference, critic_params, tokens, attention_mask, positions, *,
                       prompt_width, num_micro_batches, with_reference):
        completion_width = tokens.shape[1] - prompt_width
        params = self.compute_params(params, frozen)
        if with_reference and reference is None:  # LoRA: the frozen base, in the compute dtype
            reference = self.compute_params(frozen)

        def one(args):
            run = functools.partial(_completion_logprobs, cfg=self.compute_cfg, prompt_width=prompt_width,
                                    completion_width=completion_width, temperature=self.temperature, remat=False)
            out = run(params, tokens=args[0], attention_mask=args[1], positions=args[2], return_entropy=True,
                      critic_params=critic_params)
            (logp, entropy), values = out if critic_params is not None else (out, None)
            ref_logp = None
            if with_reference:
                ref_logp = run(reference, tokens=args[0], attention_mask=args[1], positions=args[2],
                               return_entropy=False)
            return logp, entropy, ref_logp, values

        split = [_split_rows(x, num_micro_batches) for x in (tokens, attention_mask, positions)]
        outputs = jax.lax.map(one, split)
        rows = tokens.shape[0]
        unsplit = lambda x: None if x is None else jnp.swapaxes(x, 0, 1).reshape(rows, completion_width)  # noqa: E731
        return StepLogprobs(*map(unsplit, outputs))

    # ---------------------------------------------------------------- update
    def update(self, state: LearnerState, seq: SequenceBatch, step_batch: core.StepBatch):
        """One optimiser step on the rows of `seq` / `step_batch` (one mini-batch).
        Returns (new_state, metrics dict of float32 scalars)."""
        arrays = self._place((seq.tokens, seq.attention_mask, seq.positions))
        step_batch = self._place(step_batch)
        return self._update(state, self.frozen, *arrays, step_batch, prompt_width=seq.prompt_width,
                            num_micro_batches=self._num_micro_batches(seq.tokens.shape[0]))

    def loss_and_grads(self, params, seq: SequenceBatch, step_batch: core.StepBatch):
        """(loss, grads w.r.t. the float32 master params (LoRA: the adapters), metrics) of one
        step batch, without a loss scale: the quantity `update` descends. For tests and analysis."""
        arrays = self._place((seq.tokens, seq.attention_mask, seq.positions))
        loss, (grads, _), metrics = self._grads(params, self.frozen, None, *arrays, self._place(step_batch),
                                                jnp.float32(1.0), prompt_width=seq.prompt_width,
                                                num_micro_batches=self._num_micro_batches(seq.tokens.shape[0]))
        return loss, grads, metrics

    def _grads_impl(self, params, frozen, critic_params, tokens, attention_mask, positions, step_batch, scale, *,
                    prompt_width, num_micro_batches):
        """Sum over micro-batches of d(scale * loss)/d (params, critic_params), divided by scale.
        Returns (loss, (policy grads, critic grads or None), metrics)."""
        completion_width = tokens.shape[1] - prompt_width

        def micro_loss(trainable, micro):
            params, critic_params = trainable
            tok, att, pos, batch = micro
            out = _completion_logprobs(self.compute_params(params, frozen), self.compute_cfg, tok, att, pos,
                                       prompt_width=prompt_width, completion_width=completion_width,
                                       temperature=self.temperature, return_entropy=False, remat=self.remat,
                                       critic_params=critic_params)
            logp, values = out if critic_params is not None else (out, None)
            loss, metrics = core.recipe_loss(self.recipe, logp, batch, values=values)
            return loss * scale, metrics

        grad_fn = jax.grad(micro_loss, has_aux=True)

        trainable = (params, critic_params)

        def accumulate(carry, micro):
            return jax.tree.map(jnp.add, carry, grad_fn(trainable, micro)), None

        micro = jax.tree.map(functools.partial(_split_rows, num_micro_batches=num_micro_batches),
                             (tokens, attention_mask, positions, step_batch))
        first = jax.tree.map(lambda x: x[0], micro)
        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, trainable, first))
        (grads, metrics), _ = jax.lax.scan(accumulate, zeros, micro)
        return metrics["loss"], jax.tree.map(lambda g: g / scale, grads), metrics

    def _update_impl(self, state: LearnerState, frozen, tokens, attention_mask, positions, step_batch, *,
                     prompt_width, num_micro_batches):
        critic_params = None if state.critic is None else state.critic.params
        _, (grads, critic_grads), metrics = self._grads_impl(
            state.params, frozen, critic_params, tokens, attention_mask, positions, step_batch,
            state.loss_scale.scale, prompt_width=prompt_width, num_micro_batches=num_micro_batches)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
        metrics = dict(metrics, grad_norm=grad_norm, loss_scale=state.loss_scale.scale)
        critic, policy_on = None, finite
        if state.critic is not None:
            critic_norm = optax.tree.norm(critic_grads)
            finite = finite & jnp.isfinite(critic_norm)
            policy_on = finite & (state.step >= self.critic_cfg.warmup_steps)  # warm-up: the critic alone
            critic = self._step(self.critic_optimizer, state.critic.params, state.critic.opt_state, critic_grads,
                                finite)
            critic = critic_lib.CriticState(*critic)
            metrics.update(critic_grad_norm=critic_norm, policy_held=(finite & ~policy_on).astype(jnp.float32))
        params, opt_state = self._step(self.optimizer, state.params, state.opt_state, grads, policy_on)
        loss_scale = self._next_loss_scale(state.loss_scale, finite)
        metrics["skipped"] = (~finite).astype(jnp.float32)
        return LearnerState(params, opt_state, loss_scale, state.step + 1, critic), metrics

    @staticmethod
    def _step(optimizer, params, opt_state, grads, apply):
        """(params, opt_state) after one optimiser update where `apply`, else unchanged."""
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jnp.where(apply, new, old)  # noqa: E731
        return jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state)

    def _next_loss_scale(self, current: LossScale, finite) -> LossScale:
        if not self.dynamic_loss_scale:
            return current
        cfg = self.train_cfg
        grown = current.good_steps + 1 >= cfg.loss_scale_growth_interval
        scale = jnp.where(finite, jnp.where(grown, current.scale * cfg.loss_scale_factor, current.scale),
                          jnp.maximum(current.scale / cfg.loss_scale_factor, cfg.loss_scale_min))
        good = jnp.where(finite & ~grown, current.good_steps + 1, 0)
        return LossScale(scale.astype(jnp.float32), good.astype(jnp.int32))
