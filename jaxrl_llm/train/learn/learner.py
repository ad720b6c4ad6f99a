"""The learner: one jit-compiled, micro-batched, optionally sharded optimiser step.

* Loss: `core.recipe_loss` on a `core.StepBatch` whose aggregation weights
  were fixed on the whole optimiser-step batch (`core.prepare_step_batch`),
  so the micro-batch losses are plain sums and accumulating their gradients
  equals one pass over the batch (docs/objectives.md#masked-mean-micro-batch-bias).
* Rows: a `train.packing.RowPlan` lays the step's sequences into micro-batches of
  R rows x W slots, packed first-fit-decreasing (`train.pack`) or one per row; each
  micro-batch's completion log-probs (`train.micro_batch`) are read back into the step batch's [N, T_c]
  layout and the sequences it does not hold are taken out of its loss
  (`core.restrict_rows`), so packing changes no loss, gradient or metric.
  Micro-batches packing leaves empty are skipped (`lax.cond`).
* Remat (`train.remat`): "auto" compiles the step with off, then dots, then full
  and keeps the first that fits the device's memory (`models.remat.choose_remat`).
* Precision: fp32 master weights and optimiser state always; the forward and
  backward run in the compute dtype of `TrainConfig.precision` (fp32, bf16,
  fp16), log-softmax in float32 (docs/objectives.md#precision). fp16 uses dynamic loss
  scaling: on a non-finite gradient the step is skipped and the scale halved;
  after `loss_scale_growth_interval` good steps it doubles (Micikevicius et
  al. 2018, "Mixed Precision Training"). In every precision a non-finite loss
  or gradient skips the update and is reported as `skipped`.
* Optimiser: optax AdamW behind global-norm clipping, with a warmup + constant
  / linear / cosine learning-rate schedule (`train.optimizer`).
* Sharding: the learner's one `train.learn.placement.Placement` puts every array where it
  lives (with a mesh, params follow `models.param_shardings` and batch rows are split over
  ("data", "fsdp")); jit (GSPMD) inserts the collectives.
* LoRA (`train.lora_rank` >= 1; Hu et al. 2021, `models.lora`): the trainable
  tree (`LearnerState.params`, gradients, optimiser state, checkpoints) is the
  adapters; the float32 base weights are frozen in `Learner.frozen` (set by
  `init`) and enter every jitted function as an argument. The forward uses
  `lora.merge(frozen, adapters)`, recomputed in every micro-batch's loss (one
  [in, r] x [r, out] product per matrix, cheap at this model size; the backward
  still forms each full dL/dW before projecting it onto A and B, so LoRA saves
  optimiser state and work, not backward FLOPs). `full_params` gives the
  merged weights that the rollout engines receive.
* Routing replay (`train.routing_replay`, MoE policies; `train.learn.routing_replay`): the row
  plan carries the sampler's routing records placed like the tokens (`DeviceRows.routing`, -1 where
  none); with "sampler" the policy's forward in the pi_old pass and in every gradient micro-batch
  replays them, and the pi_old pass measures where the policy's own top-k differs from them.
* Side passes (`train.learn.side_passes.SidePasses`): the reference policy (a KL term), the
  distillation teacher and the critic. Their log-probs and values come from the same micro-batched
  pi_old program (`step_logprobs`); the critic's value head reads the policy's hidden states and is
  updated with its own optimiser in the same step (`LearnerState.critic`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm import core
from jaxrl_llm.models import DecoderConfig, forward, lora
from jaxrl_llm.models.compile_options import learner_compiler_options
from jaxrl_llm.models.platform import mesh_platform
from jaxrl_llm.models.remat import choose_remat, device_memory_budget, remat_setting
from jaxrl_llm.train.config import PRECISION_DTYPES
from jaxrl_llm.train.learn import critic as critic_lib
from jaxrl_llm.train.learn import packing
from jaxrl_llm.train.learn import routing_replay as replay_lib
from jaxrl_llm.train.learn.batch import SequenceBatch
from jaxrl_llm.train.learn.micro_batch import DeviceRows, head_logprobs, to_step_layout
from jaxrl_llm.train.learn.optimizer import LossScale, make_optimizer, masked_update, next_loss_scale
from jaxrl_llm.train.learn.placement import Placement
from jaxrl_llm.train.learn import router_terms
from jaxrl_llm.train.learn.side_passes import SidePasses


class StepLogprobs(NamedTuple):
    """The learner's pass over a step batch before its updates, each float32 [N, T_c]."""

    logp: jax.Array  # pi_old
    entropy: jax.Array | None  # None: pi_old reused from the sampler (train.reuse_sampler_logprobs), no pass
    ref_logp: jax.Array | None  # the reference policy's; None without one
    values: jax.Array | None = None  # the critic's V_t; None without one
    teacher_logp: jax.Array | None = None  # the distillation teacher's; None without one
    routing_differs: jax.Array | None = None  # 1 where the learner's own top-k set differs from the record


class LearnerState(NamedTuple):
    params: Any  # float32 master weights
    opt_state: Any
    loss_scale: LossScale
    step: jax.Array  # int32: optimiser steps taken (skipped ones included)
    critic: critic_lib.CriticState | None = None  # the value head and its optimiser state


class Learner:
    """Holds the static pieces of a run (model config, recipe, optimiser, placement)
    and exposes two jitted functions: `logprobs` (pi_old recompute, entropy) and
    `update` (one optimiser step on one StepBatch)."""

    def __init__(self, model_cfg: DecoderConfig, recipe: core.Recipe, train_cfg, *, total_steps: int,
                 temperature: float = 1.0, mesh: jax.sharding.Mesh | None = None, critic_cfg=None, teacher=None,
                 batch_invariant: bool = False):
        if train_cfg.precision not in PRECISION_DTYPES:
            raise ValueError(f"train.precision={train_cfg.precision!r}; valid: {sorted(PRECISION_DTYPES)}")
        dtype = PRECISION_DTYPES[train_cfg.precision]
        self.compute_cfg = model_cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype)
        self.compute_dtype = jnp.dtype(dtype)
        self.recipe = recipe
        self.train_cfg = train_cfg
        self.temperature = float(temperature)
        self.place = Placement(mesh)  # where every array of the learner lives
        # pi_old by models.batch_invariant, one sequence per row: the JAX sampler's log-probs bit for bit
        self.batch_invariant = bool(batch_invariant)
        # "auto": chosen at the first update from the compiled step's memory estimate (`_choose_remat`)
        self.remat = remat_setting(train_cfg.remat)
        self.remat_choice = None  # models.remat.RematChoice, once "auto" has chosen
        self.dynamic_loss_scale = train_cfg.precision == "fp16"
        self.optimizer = make_optimizer(train_cfg, total_steps)
        # "sampler": pi_old and gradient passes route by the sampler's records (train/learn/routing_replay.py)
        self.routing_replay = replay_lib.check_routing_replay(train_cfg.routing_replay, model_cfg)
        self.router_coefs = router_terms.router_coefs(model_cfg, train_cfg)  # None: a dense policy
        self.lora = lora.spec_from_train_config(train_cfg, model_cfg)  # None: full fine-tuning
        self.frozen = None  # LoRA: the float32 base params, set by init
        self.side = SidePasses(recipe, self.compute_dtype, self.place, critic_cfg=critic_cfg, teacher=teacher)
        self._merge = jax.jit(self._full_params_impl)
        options = learner_compiler_options(self.compute_dtype, mesh_platform(mesh))  # XLA:CPU fusion
        # batch-invariant pi_old compiles as the sampler does: the learner's options change the dot kernels
        self._logprobs = jax.jit(self._logprobs_impl, static_argnames=("with_reference", "max_segments"),
                                 compiler_options=None if self.batch_invariant else options)
        # No buffer donation: the JAX sampler may hold the same float32 params buffers.
        self._update = jax.jit(self._update_impl, static_argnames=("max_segments", "remat"), compiler_options=options)
        self._grads = jax.jit(self._grads_impl, static_argnames=("max_segments", "remat"), compiler_options=options)

    # ----------------------------------------------------------------- state
    def init(self, params, *, seed: int = 0) -> LearnerState:
        """State for training `params` (full fine-tuning), or, with LoRA, fresh adapters
        (A from PRNGKey(seed), B = 0) on the frozen `params`, which become `self.frozen`."""
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
        critic = self.side.init_passes(params, base_is_reference=self.lora is not None,
                                       hidden_size=self.compute_cfg.hidden_size)
        if self.lora is not None:
            self.frozen = self.place.params(params)
            params = lora.init_adapters(params, self.lora, jax.random.PRNGKey(seed))
        scale = self.train_cfg.loss_scale_init if self.dynamic_loss_scale else 1.0
        others = (LossScale(jnp.float32(scale), jnp.int32(0)), jnp.int32(0), critic)  # the state after opt_state
        # LoRA's adapters are small: replicated on every device
        params, opt_state, others = self.place.train_state(self.optimizer, params, others,
                                                           replicate_params=self.lora is not None)
        return LearnerState(params, opt_state, *others)

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

    # The side passes' facts, as the learning step and the benchmarks read them (`SidePasses`).
    needs_reference = property(lambda self: self.side.needs_reference)
    reference = property(lambda self: self.side.reference)
    reference_bytes = property(lambda self: self.side.reference_bytes)
    teacher_bytes = property(lambda self: self.side.teacher_bytes)

    def _full_params_impl(self, frozen, adapters):
        return lora.merge(frozen, adapters, self.lora.scale)

    def plan(self, seq: SequenceBatch, *, pack: bool | None = None) -> packing.RowPlan:
        """Where `seq`'s sequences sit in the learner's micro-batches (`train.packing`): packed
        first-fit-decreasing (``pack``, default `train.pack`) or one per row, R rows of W slots per
        micro-batch with R from `train.micro_batch_tokens` (default: `train.micro_batch_size` rows),
        rounded up to a multiple of the data-parallel devices."""
        tokens, attention_mask = self.place.host((seq.tokens, seq.attention_mask))  # rows over processes: collective
        width = seq.tokens.shape[1]
        budget = self.train_cfg.micro_batch_tokens
        if budget is None:
            budget = min(self.train_cfg.micro_batch_size, seq.tokens.shape[0]) * width
        rows = packing.rows_per_micro_batch(budget, width, self.place.data_parallel)
        if self.routing_replay == "sampler" and seq.routing is None:
            raise ValueError("train.routing_replay='sampler' needs the sampler's routing records: SequenceBatch.routing "
                             "is None (build_sequences fills it from RolloutRecord.routed_experts)")
        routing = seq.routing if self.compute_cfg.is_moe else None
        return packing.plan_rows(tokens, attention_mask, seq.prompt_width, rows_per_micro=rows,
                                 pack=self.train_cfg.pack if pack is None else pack,
                                 routing=None if routing is None else self.place.host(routing))

    def _unpartitioned(self, tree):
        """Batch-invariant pi_old on a mesh: inputs and outputs replicated, so every device runs the
        single-device program (a partitioned one splits the rows' tiles and the weights' contractions
        over devices, and sums in another order; seen as 1-2 differing tokens a step on 8 CPU devices)."""
        return self.place.replicated_inside(tree) if self.batch_invariant else tree

    # -------------------------------------------------------------- logprobs
    def logprobs(self, params, seq: SequenceBatch) -> tuple[jax.Array, jax.Array]:
        """(logp, entropy), each float32 [N, T_c]: the learner's pi_old of the
        completion tokens at the sampling temperature, and the entropy of its
        next-token distribution there. No gradient; micro-batched."""
        out = self.step_logprobs(params, seq, with_reference=False, with_teacher=False)
        return out.logp, out.entropy

    def step_logprobs(self, params, seq: SequenceBatch, *, with_reference: bool | None = None,
                      critic: critic_lib.CriticState | None = None, with_teacher: bool | None = None) -> StepLogprobs:
        """pi_old, entropy, (with_reference; default: when the recipe has a KL term) the
        reference policy's log-probs, (with_teacher; default: when the recipe distils) the
        teacher's, and (given the `critic`) its values, all from one jitted, micro-batched
        pass: each micro-batch runs the policy's forward (the value head reads its hidden
        states), then the reference's and the teacher's."""
        with_reference = self.needs_reference if with_reference is None else with_reference
        with_teacher = self.recipe.distill is not None if with_teacher is None else with_teacher
        self.side.check(with_reference=with_reference, with_teacher=with_teacher, frozen=self.frozen)
        critic_params = None if critic is None else critic.params
        # batch-invariant: one sequence per row from slot 0, so each key sits at slot = position as in the sampler
        plan = self.plan(seq, pack=False if self.batch_invariant else None)
        return self._logprobs(params, self.frozen, self.side.reference, self.side.teacher_params if with_teacher else None,
                              critic_params, self.place.rows(plan), with_reference=with_reference,
                              max_segments=plan.max_segments)

    def _logprobs_impl(self, params, frozen, reference, teacher, critic_params, rows: DeviceRows, *, with_reference,
                       max_segments):
        params = self.compute_params(params, frozen)
        if with_reference and reference is None:  # LoRA: the frozen base, in the compute dtype
            reference = self.compute_params(frozen)

        def run(weights, *micro, cfg=self.compute_cfg, routing=None, **kwargs):
            weights, micro, routing = self._unpartitioned((weights, micro, routing))
            return self._unpartitioned(head_logprobs(
                weights, cfg, *micro, temperature=self.temperature, remat="off", max_segments=max_segments,
                batch_invariant=self.batch_invariant, routing=routing, **kwargs))

        n, completion_width = rows.completion_index.shape
        zeros = jnp.zeros((n, completion_width), jnp.float32)
        measure = rows.routing is not None  # a MoE policy with the sampler's records: routing/differs_frac
        empty = StepLogprobs(zeros, zeros, zeros if with_reference else None,
                             zeros if critic_params is not None else None, zeros if teacher is not None else None,
                             zeros if measure else None)

        def one(m, micro, record):
            replay = record if self.routing_replay == "sampler" else None
            heads = run(params, *micro, return_entropy=True, critic_params=critic_params, routing=replay,
                        return_routing=measure and replay is None)
            (logp, entropy), values = heads[:2]
            ref_logp = run(reference, *micro, return_entropy=False)[0] if with_reference else None
            teacher_logp = (None if teacher is None else
                            run(teacher, *micro, cfg=self.side.teacher_cfg, return_entropy=False)[0])
            differs = None
            if measure:  # the learner's own routing, without replay: this pass's, or a forward of its own
                own = heads[2].experts if replay is None else self._own_experts(params, micro, max_segments)
                differs = replay_lib.differs_at_heads(own, record, micro[3])
            flat = StepLogprobs(logp, entropy, ref_logp, values, teacher_logp, differs)
            return jax.tree.map(lambda x: to_step_layout(x, rows, m, 0.0), flat)

        def accumulate(total, xs):
            m, used, micro, record = xs
            part = jax.lax.cond(used, lambda: one(m, micro, record), lambda: empty)
            return jax.tree.map(jnp.add, total, part), None

        micro = (rows.tokens, rows.segment_ids, rows.positions, rows.head_slots)
        xs = (jnp.arange(rows.used.shape[0]), rows.used, micro, rows.routing)
        total, _ = jax.lax.scan(accumulate, empty, xs)
        return total

    def _own_experts(self, params, micro, max_segments: int) -> jax.Array:
        """[R, W, nL, k]: the experts the policy's own router picks for a micro-batch's rows (no replay)."""
        tokens, segment_ids, positions, _ = self._unpartitioned(micro)
        return forward(params, self.compute_cfg, tokens, positions=positions, segment_ids=segment_ids,
                       return_hidden=True, max_segments=max_segments, batch_invariant=self.batch_invariant,
                       return_routing=True).routing.experts

    # ---------------------------------------------------------------- update
    def update(self, state: LearnerState, seq: SequenceBatch, step_batch: core.StepBatch):
        """One optimiser step on the rows of `seq` / `step_batch` (one mini-batch).
        Returns (new_state, metrics dict of float32 scalars); `learner_padding_fraction` is the
        share of the slots the learner computed that held no token."""
        plan = self.plan(seq)
        args = (state, self.frozen, self.place.rows(plan), self.place.batch(step_batch))
        update = self._update
        if self.remat == "auto":
            update = self._choose_remat(args, plan.max_segments)
        state, metrics = update(*args, max_segments=plan.max_segments, remat=self.remat)
        return state, dict(metrics, learner_padding_fraction=jnp.float32(plan.padding_fraction))

    def _choose_remat(self, args, max_segments: int):
        """train.remat="auto": the first of off, dots, full whose compiled step fits the device's
        memory (`models.remat.choose_remat`); "off" where the backend reports no limit (CPU).
        Returns the update to call for this step (the chosen compiled program, not compiled again)."""
        compiled = {}

        def compile_mode(mode: str):
            compiled[mode] = self._update.lower(*args, max_segments=max_segments, remat=mode).compile()
            return compiled[mode]

        self.remat_choice = choose_remat(compile_mode, device_memory_budget(), fallback="off")
        self.remat = self.remat_choice.mode
        if self.remat not in compiled:
            return self._update
        return lambda *a, **_: compiled[self.remat](*a)

    def loss_and_grads(self, params, seq: SequenceBatch, step_batch: core.StepBatch):
        """(loss, grads w.r.t. the float32 master params (LoRA: the adapters), metrics) of one
        step batch, without a loss scale: the quantity `update` descends. For tests and analysis."""
        plan = self.plan(seq)
        remat = "off" if self.remat == "auto" else self.remat
        loss, (grads, _), metrics = self._grads(params, self.frozen, None, self.place.rows(plan),
                                                self.place.batch(step_batch), jnp.float32(1.0),
                                                max_segments=plan.max_segments, remat=remat)
        return loss, grads, metrics

    def _grads_impl(self, params, frozen, critic_params, rows: DeviceRows, step_batch, scale, *, max_segments,
                    remat: str):
        """Sum over micro-batches of d(scale * loss)/d (params, critic_params), divided by scale.
        Returns (loss, (policy grads, critic grads or None), metrics). Each micro-batch's loss is
        `core.recipe_loss` on the whole step batch's [N, T_c] arrays with the rows of the sequences
        it does not hold taken out (`core.restrict_rows`), so the micro-batch sums equal the
        unpacked batch's loss, gradients and metrics. A MoE policy adds its router losses and
        metrics over the mini-batch's real tokens (`train.learn.router_terms`)."""
        moe = self.router_coefs is not None
        real_tokens = router_terms.real_token_count(rows.segment_ids)  # the mini-batch's, all micro-batches

        def micro_loss(trainable, m, micro, replay):
            params, critic_params = trainable
            heads = head_logprobs(
                self.compute_params(params, frozen), self.compute_cfg, *micro, temperature=self.temperature,
                return_entropy=False, remat=remat, max_segments=max_segments, critic_params=critic_params,
                return_routing=moe, routing=replay)
            logp_flat, values_flat = heads[:2]
            logp = to_step_layout(logp_flat, rows, m, step_batch.old_logp)
            values = None if values_flat is None else to_step_layout(values_flat, rows, m, step_batch.old_values)
            batch = core.restrict_rows(step_batch, rows.micro_batch == m)
            loss, metrics = core.recipe_loss(self.recipe, logp, batch, values=values)
            if moe:  # micro[1]: the rows' segment ids
                sums = router_terms.micro_router_sums(heads[2], micro[1], real_tokens)
                loss, metrics = router_terms.add_router_loss(loss, metrics, sums, self.router_coefs)
            return loss * scale, metrics

        grad_fn = jax.grad(micro_loss, has_aux=True)
        trainable = (params, critic_params)
        micro = (rows.tokens, rows.segment_ids, rows.positions, rows.head_slots)
        replay = rows.routing if self.routing_replay == "sampler" else None  # train.routing_replay
        first = jax.tree.map(lambda x: x[0], (micro, replay))
        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, trainable, 0, *first))

        def accumulate(carry, xs):
            m, used, micro, replay = xs
            part = jax.lax.cond(used, lambda: grad_fn(trainable, m, micro, replay), lambda: zeros)
            return jax.tree.map(jnp.add, carry, part), None

        xs = (jnp.arange(rows.used.shape[0]), rows.used, micro, replay)
        (grads, metrics), _ = jax.lax.scan(accumulate, zeros, xs)
        if moe:
            metrics = router_terms.router_step_metrics(metrics, real_tokens)
        return metrics["loss"], jax.tree.map(lambda g: g / scale, grads), metrics

    def _update_impl(self, state: LearnerState, frozen, rows: DeviceRows, step_batch, *, max_segments, remat: str):
        critic_params = None if state.critic is None else state.critic.params
        _, (grads, critic_grads), metrics = self._grads_impl(
            state.params, frozen, critic_params, rows, step_batch, state.loss_scale.scale,
            max_segments=max_segments, remat=remat)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
        metrics = dict(metrics, grad_norm=grad_norm, loss_scale=state.loss_scale.scale)
        critic, policy_on = None, finite
        if state.critic is not None:  # warm-up: the critic alone
            critic, policy_on, finite, critic_metrics = self.side.update_critic(state.critic, critic_grads, finite,
                                                                                 state.step)
            metrics.update(critic_metrics)
        params, opt_state = masked_update(self.optimizer, state.params, state.opt_state, grads, policy_on)
        loss_scale = (next_loss_scale(state.loss_scale, finite, self.train_cfg) if self.dynamic_loss_scale
                      else state.loss_scale)
        metrics["skipped"] = (~finite).astype(jnp.float32)
        return LearnerState(params, opt_state, loss_scale, state.step + 1, critic), metrics
