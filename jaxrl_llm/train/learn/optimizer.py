"""The learner's optimiser: AdamW behind global-norm clipping with a warmup + constant / linear /
cosine learning-rate schedule, and fp16's dynamic loss scale."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class LossScale(NamedTuple):
    scale: jax.Array  # float32 scalar
    good_steps: jax.Array  # int32 scalar: finite steps since the last change


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


def next_loss_scale(current: LossScale, finite, train_cfg) -> LossScale:
    """fp16's dynamic loss scale after a step: halved (not below loss_scale_min) on a non-finite
    gradient, multiplied by loss_scale_factor after loss_scale_growth_interval finite steps
    (Micikevicius et al. 2018, "Mixed Precision Training")."""
    cfg = train_cfg
    grown = current.good_steps + 1 >= cfg.loss_scale_growth_interval
    scale = jnp.where(finite, jnp.where(grown, current.scale * cfg.loss_scale_factor, current.scale),
                      jnp.maximum(current.scale / cfg.loss_scale_factor, cfg.loss_scale_min))
    good = jnp.where(finite & ~grown, current.good_steps + 1, 0)
    return LossScale(scale.astype(jnp.float32), good.astype(jnp.int32))


def masked_update(optimizer: optax.GradientTransformation, params, opt_state, grads, apply):
    """(params, opt_state) after one optimiser update where `apply` (a traced bool), else unchanged:
    a skipped step (non-finite loss or gradient, or a critic warm-up) leaves both as they were."""
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(apply, new, old)  # noqa: E731
    return jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state)
