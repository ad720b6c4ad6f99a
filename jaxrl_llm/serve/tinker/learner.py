"""Tinker's training calls on one base model: forward, forward_backward (gradients summed into the
model's accumulator, as Tinker does until the next optim_step) and optim_step (AdamW with the
call's AdamParams, then the accumulator is cleared).

Datums of one call are right-padded to a common width (a multiple of WIDTH_BUCKET) and batch (a
multiple of BATCH_BUCKET), so a handful of programs are compiled; padding positions are masked
out of the loss, and causal attention keeps them from touching real positions.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm.models import DecoderConfig, chunked_logprobs_from_hidden, forward
from jaxrl_llm.serve.tinker import losses
from jaxrl_llm.serve.tinker.adapters import AdapterConfig, merge
from jaxrl_llm.serve.tinker.wire import Datum

WIDTH_BUCKET = 32
BATCH_BUCKET = 4
ADAM_FIELDS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


@dataclasses.dataclass
class TrainingModel:
    """One client's model: its adapters, optimiser state and the gradients summed since the last step."""

    model_id: str
    base_model: str
    config: AdapterConfig
    adapters: dict
    opt_state: Any
    grads: dict | None = None
    steps: int = 0


@dataclasses.dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # int32 [B, W]
    targets: np.ndarray  # int32 [B, W]
    inputs: dict[str, np.ndarray]  # float32 [B, W] each
    valid: np.ndarray  # bool [B, W]
    lengths: tuple[int, ...]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def check_datum(datum: Datum, index: int, needed: tuple[str, ...], vocab_size: int, max_len: int) -> None:
    """ValueError naming the datum and its bad field: token ids out of range, missing or extra
    inputs, inputs of another length than the tokens."""
    n = datum.tokens.size
    if not 1 <= n <= max_len:
        raise ValueError(f"datum {index}: model_input has {n} tokens; valid: 1 to {max_len}")
    expected = {"target_tokens", *needed}
    missing, extra = sorted(expected - set(datum.inputs)), sorted(set(datum.inputs) - expected)
    if missing or extra:
        raise ValueError(f"datum {index}: loss_fn_inputs has {sorted(datum.inputs)}, missing {missing}, "
                         f"unexpected {extra}; valid: {sorted(expected)}")
    for name, array in datum.inputs.items():
        if array.shape != (n,):
            raise ValueError(f"datum {index}: loss_fn_inputs[{name!r}] has shape {list(array.shape)}; "
                             f"valid: [{n}] (one value per model_input token)")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"datum {index}: loss_fn_inputs[{name!r}] holds NaN or inf")
    for name, ids in (("model_input", datum.tokens), ("target_tokens", datum.inputs["target_tokens"])):
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"datum {index}: {name} holds token id {int(ids.min() if ids.min() < 0 else ids.max())}; "
                             f"valid: 0 to {vocab_size - 1}")


def make_batch(data: tuple[Datum, ...], needed: tuple[str, ...]) -> Batch:
    lengths = tuple(d.tokens.size for d in data)
    shape = (_round_up(len(data), BATCH_BUCKET), _round_up(max(lengths), WIDTH_BUCKET))
    tokens, targets, valid = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.zeros(shape, bool)
    inputs = {name: np.zeros(shape, np.float32) for name in needed}
    for row, (datum, n) in enumerate(zip(data, lengths)):
        tokens[row, :n], targets[row, :n], valid[row, :n] = datum.tokens, datum.inputs["target_tokens"], True
        for name in needed:
            inputs[name][row, :n] = datum.inputs[name]
    return Batch(tokens, targets, inputs, valid, lengths)


def _objective(adapters, base, tokens, targets, inputs, valid, *, cfg, scale, loss_name, config):
    params = merge(base, adapters, scale)
    hidden, _ = forward(params, cfg, tokens, return_hidden=True)
    logp = chunked_logprobs_from_hidden(hidden, targets, params, cfg)
    total, per_token = losses.total_loss(losses.LOSSES[loss_name], logp, inputs, dict(config), valid)
    return total, (logp, per_token)


@functools.partial(jax.jit, static_argnames=("cfg", "scale", "loss_name", "config"))
def _forward(adapters, base, tokens, targets, inputs, valid, *, cfg, scale, loss_name, config):
    total, (logp, per_token) = _objective(adapters, base, tokens, targets, inputs, valid, cfg=cfg, scale=scale,
                                          loss_name=loss_name, config=config)
    return total, logp, per_token


@functools.partial(jax.jit, static_argnames=("cfg", "scale", "loss_name", "config"))
def _forward_backward(adapters, base, grads, tokens, targets, inputs, valid, *, cfg, scale, loss_name, config):
    objective = functools.partial(_objective, cfg=cfg, scale=scale, loss_name=loss_name, config=config)
    (total, (logp, per_token)), new = jax.value_and_grad(objective, has_aux=True)(
        adapters, base, tokens, targets, inputs, valid)
    summed = new if grads is None else jax.tree.map(jnp.add, grads, new)
    return total, logp, per_token, summed


def new_optimizer_state(adapters: dict) -> Any:
    return _adamw().init(adapters)


def _adamw() -> optax.GradientTransformation:
    return optax.inject_hyperparams(optax.adamw)(learning_rate=1e-4, b1=0.9, b2=0.95, eps=1e-12, weight_decay=0.0)


@jax.jit
def _adam_update(adapters, opt_state, grads, hyper):
    norm = optax.global_norm(grads)
    clip = hyper["grad_clip_norm"]
    adam = {k: v for k, v in hyper.items() if k != "grad_clip_norm"}
    factor = jnp.where(clip > 0, jnp.minimum(1.0, clip / jnp.maximum(norm, 1e-30)), 1.0)
    grads = jax.tree.map(lambda g: g * factor, grads)
    opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, **adam})
    updates, opt_state = _adamw().update(grads, opt_state, adapters)
    return optax.apply_updates(adapters, updates), opt_state, norm


class Learner:
    """The training calls of one base model (cfg and params shared by every client's adapters)."""

    def __init__(self, cfg: DecoderConfig, base: dict):
        self.cfg, self.base = cfg, base

    def run(self, model: TrainingModel, loss_fn: str, config: Mapping[str, float | str], data: tuple[Datum, ...],
            *, backward: bool) -> tuple[dict[str, list[np.ndarray]], dict[str, float]]:
        """forward (backward=False) or forward_backward: per-datum "logprobs" and "elementwise_loss"
        [N] and the metrics {"loss:sum"}; with backward, the gradients join model.grads."""
        loss = losses.check_loss(loss_fn, config)
        if not data:
            raise ValueError(f"{'forward_backward' if backward else 'forward'} with no datums; valid: at least one")
        for i, datum in enumerate(data):
            check_datum(datum, i, loss.inputs, self.cfg.vocab_size, self.cfg.max_position_embeddings)
        batch = make_batch(data, loss.inputs)
        arrays = (jnp.asarray(batch.tokens), jnp.asarray(batch.targets),
                  {k: jnp.asarray(v) for k, v in batch.inputs.items()}, jnp.asarray(batch.valid))
        options = dict(cfg=self.cfg, scale=model.config.scale, loss_name=loss_fn, config=tuple(sorted(config.items())))
        if backward:
            total, logp, per_token, model.grads = _forward_backward(model.adapters, self.base, model.grads, *arrays,
                                                                    **options)
        else:
            total, logp, per_token = _forward(model.adapters, self.base, *arrays, **options)
        logp, per_token = np.asarray(logp), np.asarray(per_token)
        outputs = {"logprobs": [logp[i, :n] for i, n in enumerate(batch.lengths)],
                   "elementwise_loss": [per_token[i, :n] for i, n in enumerate(batch.lengths)]}
        return outputs, {"loss:sum": float(total)}

    def optim_step(self, model: TrainingModel, adam: Mapping[str, float]) -> dict[str, float]:
        """One AdamW step on the summed gradients (zeros if none were summed), which are then cleared."""
        unknown = sorted(set(adam) - set(ADAM_FIELDS) - {"type"})
        if unknown:
            raise ValueError(f"optim_step params {unknown} are not supported; valid: AdamParams {list(ADAM_FIELDS)}")
        lr = adam.get("learning_rate", 1e-4)
        if not (np.isfinite(lr) and lr >= 0):
            raise ValueError(f"adam_params.learning_rate={lr!r}; valid: a finite number >= 0")
        grads = model.grads if model.grads is not None else jax.tree.map(jnp.zeros_like, model.adapters)
        hyper = {"learning_rate": lr, "b1": adam.get("beta1", 0.9), "b2": adam.get("beta2", 0.95),
                 "eps": adam.get("eps", 1e-12), "weight_decay": adam.get("weight_decay", 0.0),
                 "grad_clip_norm": adam.get("grad_clip_norm", 0.0)}
        hyper = {k: jnp.float32(v) for k, v in hyper.items()}
        model.adapters, model.opt_state, norm = _adam_update(model.adapters, model.opt_state, grads, hyper)
        model.grads, model.steps = None, model.steps + 1
        return {"grad_norm": float(norm)}
