"""What the learner does with a Recipe (core/recipes.py): two pure functions and the
batch they pass between them.

  prepare_step_batch(recipe, inputs: StepInputs) -> (StepBatch, metrics)
      Once per optimiser step on the FULL step batch: rewards shaping,
      filters, advantages, corrections, and the aggregation weights with
      their global denominators (tokens removed by filters or corrections
      leave the denominators).
  recipe_loss(recipe, logp, step_batch_slice) -> (scalar loss, metrics)
      Per micro-batch / shard. Because the weights were fixed globally, the
      loss is a plain weighted sum: summing micro-batch losses and gradients
      (or an all-reduce over data-parallel shards) equals one pass over the
      whole batch. Every metric returned is additive in the same way.

Slice a StepBatch by rows (all its arrays are [N, T]), e.g. with
`micro_batches`; never by tokens, because sequence-level losses (GSPO, GMPO,
IS-PG) need whole rows.
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.core import (_checks, advantages as adv_lib, aggregation, corrections, distill, filters, kl, losses,
                            off_policy)
from jaxrl_llm.core.recipes import Recipe
from jaxrl_llm.core.step_inputs import StepInputs, estimator_extras


class StepBatch(NamedTuple):
    """Per-token arrays of one optimiser step, all [N, T] (or None if absent).

    advantages: token-level advantages.
    loss_weights: aggregation weights w_it over the full step batch, 0 for
      tokens removed by filters or corrections.
    metric_weights: m_it / sum m over the response tokens (token mean), so
      token-averaged metrics are additive over micro-batches too.
    correction_weights: detached IS weights multiplying the policy loss (the
      response mask when the recipe has no correction).
    mask: response mask after filters (used for sequence statistics).
    old_logp, sampler_logp: constants for the loss (sampler_logp = old_logp
      when no sampler log-probs were given).
    ref_logp: reference log-probs for the KL term, or None.
    old_values, returns: critic values at rollout time and GAE returns, or None.
    selected: the recipe's token_selection on the whole step batch (Clip-Cov / KL-Cov),
      passed to the policy loss as `selected=`; None for recipes without one.
    """

    advantages: jax.Array
    loss_weights: jax.Array
    metric_weights: jax.Array
    correction_weights: jax.Array
    mask: jax.Array
    old_logp: jax.Array
    sampler_logp: jax.Array
    ref_logp: jax.Array | None = None
    old_values: jax.Array | None = None
    returns: jax.Array | None = None
    selected: jax.Array | None = None


def _check_step_inputs(recipe, rewards, mask, old_logp, sampler_logp, ref_logp, values, teacher_logp) -> None:
    missing = [name for name, x in (("mask", mask), ("old_logp", old_logp)) if x is None]
    if missing:
        raise ValueError(f"StepInputs without {' and '.join(missing)}; prepare_step_batch needs mask and old_logp, "
                         "[N, T] each")
    chex.assert_rank(rewards, 2)
    _checks.check_float(old_logp, 2)
    for optional in (sampler_logp, ref_logp, values, teacher_logp):
        if optional is not None:
            _checks.check_float(optional, 2)
    _checks.check_same_shape(
        mask=mask, old_logp=old_logp, sampler_logp=sampler_logp, ref_logp=ref_logp, values=values,
        teacher_logp=teacher_logp)
    if (recipe.distill is not None) != (teacher_logp is not None):
        raise ValueError(f"recipe {recipe.name!r} has distill={recipe.distill}; teacher_logp must be given exactly "
                         "when the recipe distils (got " + ("none" if teacher_logp is None else "one") + ")")
    _checks.check_rows_match(jnp.shape(rewards), jnp.shape(mask))
    if _checks.is_concrete(rewards):
        adv_lib.validate_rewards(rewards)
    if recipe.aggregation == "constant" and recipe.constant_length is None:
        raise ValueError(
            f"recipe {recipe.name!r} aggregates with a constant denominator: set constant_length "
            f"(the maximum generation length), e.g. get_recipe({recipe.name!r}, constant_length=1024)"
        )
    if recipe.correction is not None and sampler_logp is None:
        raise ValueError(f"recipe {recipe.name!r} corrects with {recipe.correction}; it needs sampler_logp")
    if recipe.kl_beta > 0 and ref_logp is None:
        raise ValueError(f"recipe {recipe.name!r} has kl_beta={recipe.kl_beta}; it needs ref_logp")


def prepare_step_batch(recipe: Recipe, inputs: StepInputs) -> tuple[StepBatch, dict[str, jax.Array]]:
    """Everything a step needs before the model runs, on the FULL step batch.

    Order: overlong penalty -> response filters (truncation, zero-variance
    groups) -> advantages -> correction -> aggregation weights over
    mask * keep, so rejected tokens leave the denominators -> the recipe's
    token selection (Clip-Cov / KL-Cov) among the kept tokens.

    The zero-variance group filter judges ACCURACY, as DAPO's dynamic sampling
    does (Yu et al. 2025, arXiv 2503.14476, eq. 11: keep groups with
    0 < |{correct}| < G): `correct` when given, else the rewards as passed in,
    before the overlong penalty. Judged on shaped rewards, an all-correct group
    whose lengths differ would be kept for its length penalties alone.

    Args:
      recipe: the objective.
      inputs: the step's data (core/step_inputs.py): rewards [P, G] (validated on the host when
        concrete), mask and old_logp [N, T], and what the recipe needs of the rest: sampler_logp
        for corrections, ref_logp for kl_beta > 0, values for GAE, truncated for mask_truncated,
        teacher_logp exactly with `distill` (the token advantages become
        reward_weight * A + log pi_teacher - log pi_old), and the extras the recipe's estimator
        declares in its `inputs` (VinePPO's advantages [N, T], ReMax's baseline_rewards [P],
        GDPO's reward_parts [P, G, K]); an extra it does not declare is refused.
    Returns:
      (StepBatch, metrics): metrics are float32 scalars describing the step
      (rewards, filters, corrections, mismatch_* when sampler_logp is given).
    """
    if not isinstance(inputs, StepInputs):
        raise TypeError(f"prepare_step_batch(recipe, inputs) takes a core.StepInputs, got {type(inputs).__name__}")
    rewards, mask, old_logp, sampler_logp = inputs.rewards, inputs.mask, inputs.old_logp, inputs.sampler_logp
    ref_logp, values, truncated, teacher_logp = inputs.ref_logp, inputs.values, inputs.truncated, inputs.teacher_logp
    _check_step_inputs(recipe, rewards, mask, old_logp, sampler_logp, ref_logp, values, teacher_logp)
    extras = estimator_extras(recipe, inputs)
    rewards = _checks.to_float32(rewards)
    valid = _checks.valid_tokens(mask)
    response_mask = valid.astype(jnp.float32)
    lengths = aggregation.response_lengths(valid)
    outcomes = rewards if inputs.correct is None else _checks.to_float32(inputs.correct)
    if outcomes.shape != rewards.shape:
        raise ValueError(f"correct shape {outcomes.shape} must equal rewards shape {rewards.shape} ([P, G])")
    informative = filters.zero_variance_group_mask(outcomes)
    metrics = {
        "reward_raw_mean": jnp.mean(rewards),
        "response_length_mean": jnp.mean(lengths),
        "zero_variance_group_fraction": 1.0 - jnp.mean(informative),
        "num_response_tokens": jnp.sum(lengths),
    }

    if recipe.overlong is not None:
        penalty = filters.overlong_penalty(
            lengths.reshape(rewards.shape),
            max_length=recipe.overlong.max_length,
            buffer=recipe.overlong.buffer,
            factor=recipe.overlong.factor,
        )
        rewards = rewards + penalty
        metrics["overlong_penalty_mean"] = jnp.mean(penalty)
    if truncated is not None:
        metrics["truncated_fraction"] = jnp.mean(jnp.asarray(truncated, jnp.float32))
    if recipe.mask_truncated:
        if truncated is None:
            raise ValueError(f"recipe {recipe.name!r} masks truncated responses; it needs truncated [N]")
        response_mask = filters.mask_truncated(response_mask, truncated)
    if recipe.filter_zero_variance_groups:
        response_mask = filters.expand_group_mask(informative, response_mask)
    metrics["reward_mean"] = jnp.mean(rewards)

    old_logp = _masked_constant(old_logp, response_mask)
    kl_rewards = None
    if recipe.kl_beta > 0 and recipe.kl_mode == "reward":
        kl_rewards = -recipe.kl_beta * kl.get_kl_estimator(recipe.kl_estimator)(old_logp, ref_logp, mask=response_mask)
        metrics["kl_reward_penalty_mean"] = jnp.sum(kl_rewards) / rewards.size  # per response
    token_advantages = recipe.advantage_fn(rewards, response_mask, values=values, token_rewards=kl_rewards, **extras)
    if recipe.distill is not None:
        token_advantages = token_advantages._replace(advantages=distill.distill_advantages(
            token_advantages.advantages, teacher_logp, old_logp, response_mask,
            reward_weight=recipe.distill.reward_weight))
        metrics["teacher_reverse_kl"] = distill.reverse_kl_mean(teacher_logp, old_logp, response_mask)
        metrics["teacher_signal_abs_max"] = distill.reverse_kl_abs_max(teacher_logp, old_logp, response_mask)
    has_sampler = sampler_logp is not None
    sampler_logp = _masked_constant(sampler_logp, response_mask) if has_sampler else old_logp
    if recipe.correction is None:
        none = jnp.zeros_like(response_mask)
        correction = corrections.CorrectionOutput(response_mask, response_mask, none, none)
    else:
        correction = recipe.correction(old_logp, sampler_logp, response_mask)

    loss_mask = response_mask * correction.keep
    metric_weights = aggregation.token_weights(response_mask, "token_mean")
    selected = None
    if recipe.token_selection is not None:  # on the whole batch, so no micro-batch split changes it
        selected = recipe.token_selection(token_advantages.advantages, old_logp, loss_mask)
        metrics["selected_token_fraction"] = jnp.sum(metric_weights * selected)
    batch = StepBatch(
        advantages=token_advantages.advantages,
        loss_weights=aggregation.token_weights(
            loss_mask, recipe.aggregation, constant_length=recipe.constant_length
        ),
        metric_weights=metric_weights,
        correction_weights=correction.weights,
        mask=response_mask,
        old_logp=old_logp,
        sampler_logp=sampler_logp,
        ref_logp=None if ref_logp is None else _masked_constant(ref_logp, response_mask),
        old_values=None if values is None else _masked_constant(values, response_mask),
        returns=token_advantages.returns,
        selected=selected,
    )
    metrics.update(
        num_loss_tokens=jnp.sum(loss_mask),
        filtered_token_fraction=1.0 - jnp.sum(response_mask) / jnp.maximum(jnp.sum(lengths), 1.0),
        correction_masked_fraction=jnp.sum(metric_weights * correction.masked),
        correction_clipped_fraction=jnp.sum(metric_weights * correction.clipped),
        advantage_token_mean=jnp.sum(metric_weights * token_advantages.advantages),
    )
    if has_sampler:
        metrics.update(corrections.mismatch_metrics(old_logp, sampler_logp, response_mask))
        metrics.update(off_policy.mask_fractions(old_logp, sampler_logp, response_mask))
    return batch, metrics


def _masked_constant(x, mask) -> jax.Array:
    valid = _checks.valid_tokens(mask)
    return _checks.masked_zero(jax.lax.stop_gradient(_checks.to_float32(x)), valid)


def recipe_loss(
    recipe: Recipe, logp, batch: StepBatch, *, values=None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Scalar loss of (a row slice of) a prepared step batch.

    L = sum_it w_it c_it l_it + beta sum_it w_it k_it [+ value_coef sum_it w_it v_it]

    with w the precomputed aggregation weights, c the correction weights, l
    the recipe's policy loss, k its KL estimator and v the clipped value loss
    (only when `values` is given). All sums are over the slice, so losses,
    gradients and metrics of micro-batches / shards add up to the full batch.

    Args:
      recipe: the objective used in prepare_step_batch.
      logp: [n, T] current-policy log-probs of the slice (differentiable).
      batch: StepBatch rows matching logp.
      values: [n, T] current critic values (differentiable), optional.
    Returns:
      (loss, metrics) with metrics policy_loss, clip_fraction (token mean),
      and kl / kl_loss, value_loss when used. All additive over slices.
    """
    selection = {} if batch.selected is None else {"selected": batch.selected}
    output = recipe.policy_loss_fn(
        logp, batch.old_logp, batch.advantages, batch.mask, sampler_logp=batch.sampler_logp, **selection
    )
    policy_loss = aggregation.aggregate(output.loss * batch.correction_weights, batch.loss_weights)
    metrics = {
        "policy_loss": policy_loss,
        "clip_fraction": jnp.sum(output.clipped * batch.metric_weights),
    }
    loss = policy_loss
    if recipe.kl_beta > 0 and batch.ref_logp is None:
        raise ValueError(f"recipe {recipe.name!r} has kl_beta > 0 but the batch has no ref_logp")
    if batch.ref_logp is not None:
        per_token_kl = kl.get_kl_estimator(recipe.kl_estimator)(logp, batch.ref_logp, mask=batch.mask)
        metrics["kl"] = jnp.sum(per_token_kl * batch.metric_weights)
        if recipe.kl_beta > 0 and recipe.kl_mode == "loss":
            kl_loss = aggregation.aggregate(per_token_kl, batch.loss_weights)
            loss = loss + recipe.kl_beta * kl_loss
            metrics["kl_loss"] = kl_loss
    if values is not None:
        if batch.returns is None or batch.old_values is None:
            raise ValueError(f"recipe {recipe.name!r} has no critic targets in the batch; values unusable")
        per_token_value = losses.clipped_value_loss(
            values, batch.old_values, batch.returns, batch.mask, clip_range=recipe.value_clip
        )
        value_loss = aggregation.aggregate(per_token_value, batch.loss_weights)
        loss = loss + recipe.value_coef * value_loss
        metrics["value_loss"] = value_loss
    metrics["loss"] = loss
    return loss, metrics


def micro_batches(batch: StepBatch, num_micro_batches: int) -> list[StepBatch]:
    """Splits a StepBatch by rows into equal consecutive micro-batches."""
    rows = batch.mask.shape[0]
    if num_micro_batches < 1 or rows % num_micro_batches:
        raise ValueError(f"cannot split {rows} rows into {num_micro_batches} equal micro-batches")
    size = rows // num_micro_batches
    return [
        jax.tree.map(lambda x, k=k: x[k * size : (k + 1) * size], batch)
        for k in range(num_micro_batches)
    ]


def restrict_rows(batch: StepBatch, keep) -> StepBatch:
    """The batch with rows where ``keep`` [N] is 0 taken out of the loss and every metric (their
    weights and mask zeroed), shapes unchanged: a micro-batch that holds only some of the
    sequences (packing) sums to its part of the step's loss, and the parts add up to the whole."""
    keep = jnp.asarray(keep, jnp.float32)[:, None]
    return batch._replace(loss_weights=batch.loss_weights * keep, metric_weights=batch.metric_weights * keep,
                          correction_weights=batch.correction_weights * keep, mask=batch.mask * keep)
