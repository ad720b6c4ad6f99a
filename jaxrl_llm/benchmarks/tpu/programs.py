"""The programs of one RL step, lowered ahead of time from shapes only (no weights), with the run's
own mesh and sharding rules, for whatever devices the mesh holds (a TPU slice's deviceless devices).

Each program is the function the run itself jits, called as the run calls it:

* ``learner_update``: `Learner._update` (the gradient micro-steps of one mini-batch, accumulated in
  its scan over micro-batches, then the optimiser update; packed rows, ``train.remat``, LoRA's
  adapters on the frozen base, the critic's head and optimiser when set);
* ``pi_old``: `Learner._logprobs` (the pi_old pass over the step's sequences, with the reference
  policy's log-probs when the recipe has a KL term and the critic's values when set);
* ``sampler_prefill``: `rollout.decode_slots.prefill_prompts` over the step's distinct prompts;
* ``sampler_decode_step``: the slot decode's steps (`decode_slots.generate_slots`' loop body: the
  decoder over one token per slot with the KV cache, then the LM head), ``rollout.max_tokens`` of them
  in one loop as the sampler runs them (per-step figures: the loop's / its steps), or the compacting
  decode's (``rollout.decode="compact"``: `models.forward` with the cache, `jax_sampler._generate`'s body);
* ``weight_handoff``: the learner's float32 weights (LoRA merged) cast to the sampler's dtype and
  moved into the sampler's layout (`sampler_param_shardings`; with ``rollout.mesh``, the sampler's own
  mesh over the same chips and `rollout.sampler_mesh.SamplerLayout`: KV heads repeated, tensor-parallel).

Choices that depend on the hardware follow the mesh's devices (`models.platform.compiling_for`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm import core
from jaxrl_llm.models import DecoderConfig, init_cache, lm_head_logits, lora, param_shapes, param_shardings
from jaxrl_llm.models.decode_attention import CACHE_MULTIPLE, resolve_decode_kernel
from jaxrl_llm.models.decoder import Decoder, forward
from jaxrl_llm.models.platform import compiling_for, mesh_platform
from jaxrl_llm.models.sharding import BATCH_AXES, batch_sharding, cache_shardings
from jaxrl_llm.rollout.decode_slots import prefill_prompts
from jaxrl_llm.rollout.jax_sampler import decode_path
from jaxrl_llm.rollout.sampler_mesh import SamplerLayout, repeat_kv_heads, sampler_mesh
from jaxrl_llm.train.learn import critic as critic_lib
from jaxrl_llm.train.learn import packing
from jaxrl_llm.train.learn.learner import Learner, LearnerState
from jaxrl_llm.train.learn.micro_batch import DeviceRows
from jaxrl_llm.train.learn.optimizer import LossScale
from jaxrl_llm.train.sample.engines import sampler_dtype

P = jax.sharding.PartitionSpec


class StepShape(NamedTuple):
    """The sizes of one RL step: prompts x samples per prompt, each prompt ``prompt_len`` tokens and
    ``new_tokens`` sampled tokens; the learner's rows are prompt_len + new_tokens wide."""

    prompts: int
    samples: int
    prompt_len: int
    new_tokens: int

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def width(self) -> int:
        return self.prompt_len + self.new_tokens


class Program(NamedTuple):
    """One lowered program of the step, with what it is (sizes, choices) in ``notes``."""

    name: str
    lowered: Any  # jax.stages.Lowered
    notes: dict


def _spec(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def _placed(tree, shardings):
    """ShapeDtypeStructs of ``tree`` (shapes) with ``shardings`` (a tree like it, or one sharding)."""
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: _spec(x.shape, x.dtype, shardings), tree)
    return jax.tree.map(lambda x, s: _spec(x.shape, x.dtype, s), tree, shardings)


def sampler_param_shardings(shapes, mesh: jax.sharding.Mesh):
    """Where the sampler's weights live without ``rollout.mesh``: the learner's layout
    (`models.param_shardings`: FSDP over every chip)."""
    return param_shardings(shapes, mesh)


def _batch_split(mesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def _learner_rows(mesh, shape) -> jax.sharding.NamedSharding:
    """Rows split over the learner mesh's batch axes (`models.batch_sharding`) when they divide them; else
    replicated (a step of fewer prompts than chips)."""
    return batch_sharding(mesh, len(shape)) if shape[0] % _batch_split(mesh) == 0 else \
        jax.sharding.NamedSharding(mesh, P())


def sampler_layout(rollout_mesh, sampler_cfg: DecoderConfig, mesh, *, decode: str) -> SamplerLayout | None:
    """The sampler's own layout of ``rollout.mesh`` (a `SamplerMeshConfig`) over ``mesh``'s chips for the
    ``decode`` path (`SamplerLayout.plan`); None when unset."""
    if rollout_mesh is None or not rollout_mesh.enabled:
        return None
    return SamplerLayout.plan(sampler_cfg, sampler_mesh(*rollout_mesh.sizes(), devices=list(mesh.devices.flat)),
                              decode)


def _abstract_state(learner: Learner, model_cfg: DecoderConfig, mesh) -> tuple[LearnerState, Any, Any]:
    """(LearnerState, frozen base or None, reference or None) as ShapeDtypeStructs placed as
    `train.learn.placement.Placement` places the real ones."""
    replicated = jax.sharding.NamedSharding(mesh, P())
    master = param_shapes(model_cfg, jnp.float32)
    master_shardings = param_shardings(master, mesh)
    frozen = None
    trainable, trainable_shardings = master, master_shardings
    if learner.lora is not None:
        frozen = _placed(master, master_shardings)
        trainable = jax.eval_shape(lambda p: lora.init_adapters(p, learner.lora, jax.random.PRNGKey(0)), master)
        trainable_shardings = jax.tree.map(lambda _: replicated, trainable)
    opt_state = jax.eval_shape(learner.optimizer.init, trainable)
    opt_state = optax.tree_utils.tree_map_params(
        learner.optimizer, lambda x, s: _spec(x.shape, x.dtype, s), opt_state, trainable_shardings,
        transform_non_params=lambda x: _spec(x.shape, x.dtype, replicated))
    critic = None
    if learner.side.needs_critic:
        head = jax.eval_shape(lambda: critic_lib.init_critic_params(model_cfg.hidden_size))
        critic = _placed(critic_lib.CriticState(head, jax.eval_shape(learner.side.critic_optimizer.init, head)),
                         replicated)
    scalars = _placed((LossScale(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)), jnp.zeros((), jnp.int32)),
                      replicated)
    state = LearnerState(_placed(trainable, trainable_shardings), opt_state, scalars[0], scalars[1], critic)
    reference = None
    if learner.needs_reference and learner.lora is None:
        reference = _placed(param_shapes(model_cfg, learner.compute_dtype), master_shardings)
    return state, frozen, reference


def _abstract_rows(learner: Learner, shape: StepShape, sequences: int, mesh) -> DeviceRows:
    """A row plan's device arrays for ``sequences`` sequences of the step's width, R rows per micro-batch
    as `Learner.plan` picks them (train.micro_batch_tokens, else train.micro_batch_size rows)."""
    train = learner.train_cfg
    budget = train.micro_batch_tokens or min(train.micro_batch_size, sequences) * shape.width
    rows = packing.rows_per_micro_batch(budget, shape.width, learner.place.data_parallel)
    micro = math.ceil(sequences / rows)
    split = jax.sharding.NamedSharding(mesh, P(None, BATCH_AXES, None))
    replicated = jax.sharding.NamedSharding(mesh, P())
    per_micro = [_spec((micro, rows, shape.width), jnp.int32, split) for _ in range(3)]
    routing = None
    cfg = learner.compute_cfg
    if cfg.is_moe and learner.routing_replay == "sampler":
        routing = _spec((micro, rows, shape.width, cfg.num_layers, cfg.num_experts_per_tok), jnp.int32,
                        jax.sharding.NamedSharding(mesh, P(None, BATCH_AXES, None, None, None)))
    return DeviceRows(*per_micro, _spec((micro, rows * shape.new_tokens), jnp.int32, replicated),
                      _spec((micro,), bool, replicated), _spec((sequences, shape.new_tokens), jnp.int32, replicated),
                      _spec((sequences,), jnp.int32, replicated), routing=routing)


def _abstract_step_batch(learner: Learner, shape: StepShape, prompts: int, mesh) -> core.StepBatch:
    """The mini-batch's `core.StepBatch` (its structure from `core.prepare_step_batch` itself), rows
    split over the batch axes."""
    n, t = prompts * shape.samples, shape.new_tokens

    def f32(*dims):
        return jax.ShapeDtypeStruct(dims, jnp.float32)

    recipe = learner.recipe
    needs = core.estimator_inputs(recipe)
    if needs:
        raise ValueError(f"recipe {recipe.name!r}: its estimator's extra inputs {list(needs)} have no abstract "
                         "form in the compile yet; compile a recipe without them (e.g. recipe.name=grpo)")
    inputs = core.StepInputs(rewards=f32(prompts, shape.samples), mask=f32(n, t), old_logp=f32(n, t),
                             sampler_logp=f32(n, t), ref_logp=f32(n, t) if learner.needs_reference else None,
                             values=f32(n, t) if learner.side.needs_critic else None,
                             truncated=jax.ShapeDtypeStruct((n,), bool), correct=f32(prompts, shape.samples))
    batch = jax.eval_shape(lambda x: core.prepare_step_batch(recipe, x)[0], inputs)
    return jax.tree.map(lambda x: _spec(x.shape, x.dtype, batch_sharding(mesh, len(x.shape))), batch)


def learner_programs(learner: Learner, model_cfg: DecoderConfig, shape: StepShape, mesh, *, remat: str,
                     minibatches: int = 1) -> list[Program]:
    """``learner_update`` (one mini-batch: prompts / minibatches groups) and ``pi_old`` (the whole step)."""
    state, frozen, reference = _abstract_state(learner, model_cfg, mesh)
    mini_prompts = shape.prompts // minibatches
    rows = _abstract_rows(learner, shape, mini_prompts * shape.samples, mesh)
    batch = _abstract_step_batch(learner, shape, mini_prompts, mesh)
    update = learner._update.lower(state, frozen, rows, batch, max_segments=1, remat=remat)
    notes = {"remat": remat, "micro_batches": int(rows.tokens.shape[0]), "rows_per_micro_batch": int(rows.tokens.shape[1]),
             "row_width": shape.width, "sequences": mini_prompts * shape.samples, "lora": learner.lora is not None,
             "critic": learner.side.needs_critic, "precision": learner.train_cfg.precision}
    programs = [Program("learner_update", update, notes)]
    all_rows = _abstract_rows(learner, shape, shape.sequences, mesh)
    pi_old = learner._logprobs.lower(state.params, frozen, reference, None,
                                     None if state.critic is None else state.critic.params, all_rows,
                                     with_reference=learner.needs_reference, max_segments=1)
    programs.append(Program("pi_old", pi_old, {"micro_batches": int(all_rows.tokens.shape[0]),
                                               "reference": learner.needs_reference,
                                               "critic": learner.side.needs_critic, "sequences": shape.sequences}))
    return programs


def _slot_decode_step(params, cfg: DecoderConfig, kv, tokens, lengths, kernel: str):
    """One step of the slot decode as `decode_slots.generate_slots`' loop body runs it: each slot's
    token at its own cache slot ``lengths``, attention over its prefix, then the LM head."""
    capacity = kv["k"].shape[2]
    position = jnp.minimum(lengths, capacity - 1)[:, None]
    visible = jnp.arange(capacity)[None, None, :] <= position[:, :, None]
    decoder = Decoder(cfg, decode_kernel=kernel)
    out = decoder.apply({"params": params}, tokens[:, None], position, visible, kv, lengths[:, None],
                        return_hidden=True)
    return out[1], lm_head_logits(out[0][:, 0], params=params, cfg=cfg)


def _compact_decode_step(params, cfg: DecoderConfig, cache, tokens, active, cache_window: int):
    """One step of the compacting decode (`jax_sampler._generate`'s body): `forward` with the cache."""
    hidden, cache = forward(params, cfg, tokens[:, None], attention_mask=active[:, None], cache=cache,
                            return_hidden=True, cache_window=cache_window)
    return cache, lm_head_logits(hidden[:, 0], params=params, cfg=cfg)


def _slot_decode_loop(params, cfg: DecoderConfig, kv, tokens, lengths, kernel: str, steps: int):
    """``steps`` slot-decode steps in one loop, as `generate_slots` runs them (its state stays in the loop,
    so XLA lays the cache out once per loop, not once per step); the next token is the argmax."""
    def body(_, carry):
        kv, tokens, lengths = carry
        kv, logits = _slot_decode_step(params, cfg, kv, tokens, lengths, kernel)
        return kv, jnp.argmax(logits, axis=-1).astype(tokens.dtype), lengths + 1

    return jax.lax.fori_loop(0, steps, body, (kv, tokens, lengths))


def _compact_decode_loop(params, cfg: DecoderConfig, cache, tokens, active, cache_window: int, steps: int):
    """``steps`` compacting-decode steps in one loop (`_slot_decode_loop`'s reason)."""
    def body(_, carry):
        cache, tokens = carry
        cache, logits = _compact_decode_step(params, cfg, cache, tokens, active, cache_window)
        return cache, jnp.argmax(logits, axis=-1).astype(tokens.dtype)

    return jax.lax.fori_loop(0, steps, body, (cache, tokens))


def sampler_programs(sampler_cfg: DecoderConfig, shape: StepShape, mesh, *, path: str, kernel: str,
                     slots: int | None, cache_window: int = 32, batch_invariant: bool = False,
                     layout: SamplerLayout | None = None, decode_steps: int = 1) -> list[Program]:
    """``sampler_prefill`` and ``sampler_decode_step`` in the sampler's dtype and layout (``layout``: the
    sampler's own mesh, `sampler_layout`; None: the learner's ``mesh`` and layout). ``decode_steps`` > 1:
    the decode program is that many steps in one loop (`_slot_decode_loop`); its figures are the loop's,
    ``decode_steps`` in its notes (the report divides by it for per-step figures)."""
    if layout is not None:
        sampler_cfg, mesh = layout.model_config(sampler_cfg), layout.mesh
    shapes = param_shapes(sampler_cfg)
    params = _placed(shapes, sampler_param_shardings(shapes, mesh) if layout is None
                     else layout.param_shardings(shapes))
    replicated = jax.sharding.NamedSharding(mesh, P())
    rows_of = (lambda s: _learner_rows(mesh, s)) if layout is None else layout.rows_sharding
    prompts = _spec((shape.prompts, shape.prompt_len), jnp.int32, rows_of((shape.prompts, shape.prompt_len)))
    mask = _spec((shape.prompts, shape.prompt_len), bool, rows_of((shape.prompts, shape.prompt_len)))
    prefill = jax.jit(lambda p, t, m: prefill_prompts(
        p, sampler_cfg, t, m, lambda h: lm_head_logits(h, params=p, cfg=sampler_cfg), batch_invariant))
    programs = [Program("sampler_prefill", prefill.lower(params, prompts, mask),
                        {"prompts": shape.prompts, "prompt_len": shape.prompt_len})]
    batch = slots or shape.sequences
    capacity = -(-shape.width // CACHE_MULTIPLE) * CACHE_MULTIPLE
    cache = jax.eval_shape(lambda: init_cache(sampler_cfg, batch, capacity))
    if layout is None:
        cache = _placed(cache, cache_shardings(cache, mesh) if batch % _batch_split(mesh) == 0 else replicated)
    else:
        cache = _placed(cache, {"k": layout.cache_sharding(cache["k"].shape),
                                "v": layout.cache_sharding(cache["v"].shape), "mask": rows_of(cache["mask"].shape),
                                "end": replicated, "next_pos": rows_of((batch,))})
    rows = _spec((batch,), jnp.int32, rows_of((batch,)))
    loop = {"steps": decode_steps} if decode_steps > 1 else {}
    if path == "slots":
        fn = _slot_decode_loop if loop else _slot_decode_step
        step = jax.jit(fn, static_argnames=("cfg", "kernel", *loop))
        lowered = step.lower(params, sampler_cfg, {"k": cache["k"], "v": cache["v"]}, rows, rows, kernel=kernel,
                             **loop)
        notes = {"path": "slots", "kernel": kernel}
    else:
        fn = _compact_decode_loop if loop else _compact_decode_step
        step = jax.jit(fn, static_argnames=("cfg", "cache_window", *loop))
        active = _spec((batch,), bool, rows_of((batch,)))
        cache = dict(cache, end=_spec((), jnp.int32, replicated))
        lowered = step.lower(params, sampler_cfg, cache, rows, active, cache_window=cache_window, **loop)
        notes = {"path": "compact", "cache_window": cache_window}
    notes.update(decode_steps=decode_steps, batch=batch, cache_slots=capacity, live_kv_slots=shape.width, **_layout_notes(layout))
    programs.append(Program("sampler_decode_step", lowered, notes))
    return programs


def handoff_program(learner: Learner, model_cfg: DecoderConfig, dtype: str, mesh,
                    layout: SamplerLayout | None = None) -> Program:
    """``weight_handoff``: the learner's float32 weights (LoRA: adapters merged into the frozen base,
    `Learner.full_params`) cast to the sampler's dtype, in the sampler's layout (``layout``: its own mesh,
    KV heads repeated as `SamplerLayout.placer` does; None: the learner's layout)."""
    state, frozen, _ = _abstract_state(learner, model_cfg, mesh)
    repeat = 1 if layout is None else layout.kv_repeat

    def handoff(params, frozen):
        full = params if frozen is None else lora.merge(frozen, params, learner.lora.scale)
        cast = jax.tree.map(lambda x: x.astype(dtype), full)
        return repeat_kv_heads(cast, model_cfg.num_kv_heads, model_cfg.head_dim, repeat)

    out = jax.eval_shape(handoff, state.params, frozen)
    target = sampler_param_shardings(out, mesh) if layout is None else layout.param_shardings(out)
    lowered = jax.jit(handoff, out_shardings=target).lower(state.params, frozen)
    return Program("weight_handoff", lowered, {"dtype": dtype, "lora_merged": frozen is not None,
                                               **_layout_notes(layout)})


def _layout_notes(layout: SamplerLayout | None) -> dict:
    if layout is None:
        return {"sampler_layout": "learner (FSDP)"}
    return {"sampler_layout": f"rollout.mesh data {layout.mesh.shape['data']} x tensor {layout.mesh.shape['tensor']}",
            "kv_repeat": layout.kv_repeat, "split_heads": layout.split_heads, "split_slots": layout.split_slots}


def step_programs(cfg, model_cfg: DecoderConfig, mesh, *, prompt_len: int, remat: str | None = None,
                  recipe: core.Recipe | None = None) -> list[Program]:
    """Every program of one RL step of the run ``cfg`` (a `train.config.Config`) for the policy
    ``model_cfg`` on ``mesh``, lowered from shapes (module doc). ``remat``: the learner's mode
    (default train.remat; "auto" is the caller's to resolve, e.g. `compile.choose_remat_for`)."""
    from jaxrl_llm.train.plan import plan_run

    if cfg.distill.teacher is not None:
        raise ValueError("distill: the teacher's pass is not compiled yet; compile the run without distillation")
    recipe = plan_run(cfg).recipe if recipe is None else recipe
    shape = StepShape(cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt, prompt_len, cfg.rollout.max_tokens)
    model_cfg = dataclasses.replace(model_cfg, max_position_embeddings=max(model_cfg.max_position_embeddings,
                                                                           shape.width + CACHE_MULTIPLE))
    platform = mesh_platform(mesh)
    remat = remat or cfg.train.remat
    if remat == "auto":
        raise ValueError("remat 'auto' must be resolved before lowering (compile.choose_remat_for)")
    with compiling_for(platform):
        learner = Learner(model_cfg, recipe, cfg.train, total_steps=cfg.total_steps,
                          temperature=cfg.rollout.temperature, mesh=mesh, critic_cfg=cfg.critic,
                          batch_invariant=cfg.rollout.batch_invariant)
        programs = learner_programs(learner, model_cfg, shape, mesh, remat=remat,
                                    minibatches=cfg.train.minibatches_per_batch)
        dtype = sampler_dtype(cfg.model, cfg.train.precision)
        sampler_cfg = model_cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype)
        path = decode_path(cfg.rollout.decode, platform)
        kernel = resolve_decode_kernel(cfg.rollout.decode_kernel, platform)
        layout = sampler_layout(cfg.rollout.mesh, sampler_cfg, mesh, decode=path)
        programs += sampler_programs(sampler_cfg, shape, mesh, path=path, kernel=kernel,
                                     slots=cfg.rollout.decode_slots, batch_invariant=cfg.rollout.batch_invariant,
                                     layout=layout, decode_steps=shape.new_tokens)
        programs.append(handoff_program(learner, model_cfg, dtype, mesh, layout))
    return programs

