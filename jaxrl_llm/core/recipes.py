"""Named objectives as visible compositions of the core functions.

A Recipe is to the objectives what optax.chain is to optimisers: every piece
(advantage estimator, policy loss with its hyperparameters bound, aggregation
mode, mismatch correction, KL term, filters) is a field holding one of the
functions in this package, and the whole registry is in one place (RECIPES,
below). No flag inside a loss changes its meaning.

The learner calls two pure functions:

  prepare_step_batch(recipe, rewards, mask, old_logp, sampler_logp, ...)
      -> (StepBatch, metrics)
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

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks, advantages as adv_lib, aggregation, corrections, filters, kl, losses


def _fold_sequence(rewards, token_rewards):
    """rewards [P, G] plus each response's summed per-token rewards [N, T] (None: unchanged)."""
    if token_rewards is None:
        return rewards
    return rewards + jnp.sum(token_rewards, axis=1).reshape(jnp.shape(rewards))


class TokenAdvantages(NamedTuple):
    advantages: jax.Array  # [N, T]
    returns: jax.Array | None  # [N, T] critic targets, only for estimators with a critic


@dataclasses.dataclass(frozen=True)
class GroupAdvantage:
    """A per-response estimator ([P, G] -> [P, G]) broadcast onto tokens."""

    estimator: Callable[[jax.Array], jax.Array]

    def __call__(self, rewards, mask, *, values=None, token_rewards=None) -> TokenAdvantages:
        """token_rewards: optional [N, T] per-token rewards (e.g. a KL penalty), summed over
        each response into its scalar reward, since the estimator sees one reward per response."""
        rewards = _fold_sequence(rewards, token_rewards)
        return TokenAdvantages(adv_lib.broadcast_to_tokens(self.estimator(rewards), mask), None)


@dataclasses.dataclass(frozen=True)
class TokenAdvantage:
    """An estimator that is token-level already ((rewards, mask) -> [N, T])."""

    estimator: Callable[[jax.Array, jax.Array], jax.Array]

    def __call__(self, rewards, mask, *, values=None, token_rewards=None) -> TokenAdvantages:
        """token_rewards: as GroupAdvantage (summed into each response's reward)."""
        return TokenAdvantages(self.estimator(_fold_sequence(rewards, token_rewards), mask), None)


@dataclasses.dataclass(frozen=True)
class GaeAdvantage:
    """GAE on the outcome reward placed on each response's last valid token."""

    gamma: float
    lam: float

    def __call__(self, rewards, mask, *, values=None, token_rewards=None) -> TokenAdvantages:
        """token_rewards: optional [N, T] per-token rewards added where they occur (a
        per-token KL penalty, as in Ouyang et al. 2022), on top of the terminal reward."""
        if values is None:
            raise ValueError("GAE advantages need critic values [N, T]: pass values= to prepare_step_batch")
        placed = adv_lib.terminal_token_rewards(rewards, mask)
        if token_rewards is not None:
            placed = placed + jnp.where(_checks.valid_tokens(mask), token_rewards, 0.0)
        out = adv_lib.gae_advantages(placed, values, mask, gamma=self.gamma, lam=self.lam)
        return TokenAdvantages(out.advantages, out.returns)


@dataclasses.dataclass(frozen=True)
class MonteCarloAdvantage:
    """VinePPO (Kazemnejad et al. 2024, arXiv 2410.01679): each token gets its chunk's
    advantage V(b_{j+1}) - V(b_j), with V Monte-Carlo estimates from extra rollouts of the
    response's prefixes (`vineppo.chunk_advantages`). Those rollouts need the rollout
    engine, so the advantages are estimated outside the step (the RL loop:
    train/vineppo_step.py) and enter as `prepare_step_batch(..., advantages=)`; this
    estimator only places them on the valid tokens (filtered tokens get 0)."""

    def __call__(self, rewards, mask, *, values=None, token_rewards=None, advantages=None) -> TokenAdvantages:
        if advantages is None:
            raise ValueError("VinePPO advantages come from extra rollouts: pass advantages= [N, T] (the RL loop's "
                             "train/vineppo_step.py estimates them) to prepare_step_batch")
        if token_rewards is not None:
            raise ValueError("VinePPO's Monte-Carlo values are of the graders' rewards; per-token rewards "
                             "(kl_mode='reward') are not part of them: use kl_mode='loss'")
        _checks.check_same_shape(advantages=advantages, mask=mask)
        valid = _checks.valid_tokens(mask)
        return TokenAdvantages(jnp.where(valid, _checks.to_float32(advantages), 0.0), None)


@dataclasses.dataclass(frozen=True)
class OverlongPenalty:
    """DAPO soft overlong punishment added to rewards (see filters.overlong_penalty)."""

    max_length: int
    buffer: int
    factor: float = 1.0


KL_MODES = ("loss", "reward")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One named objective, composed of core functions.

    Fields:
      name: registry key.
      advantage_fn: (rewards [P, G], mask [N, T], *, values) -> TokenAdvantages.
      policy_loss_fn: a losses.* function with its hyperparameters bound.
      aggregation: one of aggregation.AGGREGATION_MODES.
      constant_length: L_const for 'constant' aggregation (e.g. the maximum
        generation length); required there, unused otherwise.
      correction: a corrections.* function with its hyperparameters bound
        (token/sequence TIS/MIS, geometric rejection), or None.
      kl_beta: weight of the KL-to-reference term (0 = off).
      kl_estimator: 'k1', 'k2' or 'k3'.
      kl_mode: where the KL goes (KL_MODES): 'loss' adds beta * aggregate(k) to the
        loss (GRPO, Shao et al. 2024); 'reward' subtracts beta * k_t, computed with
        pi_old and detached, from the rewards before the advantages (Ouyang et al.
        2022; summed per response for estimators that take one reward per response).
      filter_zero_variance_groups: drop groups with all-equal rewards.
      mask_truncated: drop truncated responses (needs `truncated`).
      overlong: OverlongPenalty added to rewards, or None.
      dynamic_sampling: the sampler should over-sample prompts and keep only groups
        whose accuracy is neither 0 nor 1 until the batch is full (DAPO; done by the
        RL loop, train/dynamic_sampling.py, not by these functions).
      value_coef, value_clip: critic loss weight and clip (used when
        recipe_loss gets `values`).
      source: where the composition comes from.
    """

    name: str
    advantage_fn: Callable[..., TokenAdvantages]
    policy_loss_fn: Callable[..., losses.PolicyLossOutput]
    aggregation: str
    constant_length: float | None = None
    correction: Callable[..., corrections.CorrectionOutput] | None = None
    kl_beta: float = 0.0
    kl_estimator: str = "k3"
    kl_mode: str = "loss"
    filter_zero_variance_groups: bool = False
    mask_truncated: bool = False
    overlong: OverlongPenalty | None = None
    dynamic_sampling: bool = False
    value_coef: float = 0.0
    value_clip: float | None = None
    source: str = ""

    def __post_init__(self):
        aggregation.check_mode(self.aggregation)
        kl.get_kl_estimator(self.kl_estimator)
        if self.kl_mode not in KL_MODES:
            raise ValueError(f"kl_mode={self.kl_mode!r}; valid: {', '.join(KL_MODES)}")
        _checks.check_positive("kl_beta", self.kl_beta, allow_zero=True)


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


_ppo = functools.partial(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.2)
_grpo_std = GroupAdvantage(functools.partial(adv_lib.grpo_advantages, ddof=1, eps=1e-6))
_group_mean = GroupAdvantage(adv_lib.dr_grpo_advantages)

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            name="grpo",
            advantage_fn=_grpo_std,
            policy_loss_fn=_ppo,
            aggregation="seq_mean_token_mean",
            source="Shao et al. 2024, DeepSeekMath (arXiv 2402.03300); the paper also adds "
            "a k3 KL with beta=0.04: get_recipe('grpo', kl_beta=0.04) to reproduce it",
        ),
        Recipe(
            name="dr_grpo",
            advantage_fn=_group_mean,
            policy_loss_fn=_ppo,
            aggregation="constant",
            constant_length=None,  # the maximum generation length: set it with get_recipe
            source="Liu et al. 2025, Dr. GRPO (arXiv 2503.20783)",
        ),
        Recipe(
            name="dapo",
            advantage_fn=_grpo_std,
            policy_loss_fn=functools.partial(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.28),
            aggregation="token_mean",
            filter_zero_variance_groups=True,
            # the paper's soft overlong punishment; the RL loop rescales L_max to its generation
            # limit and keeps the buffer's share (4096 / 20480 = 20%)
            overlong=OverlongPenalty(max_length=20480, buffer=4096),
            dynamic_sampling=True,
            source="Yu et al. 2025, DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, "
            "token-level loss, soft overlong punishment L_max=20480, buf=4096 (eq. 13)",
        ),
        Recipe(
            name="olmo3",
            advantage_fn=_group_mean,
            policy_loss_fn=functools.partial(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.272),
            aggregation="token_mean",
            correction=functools.partial(corrections.token_tis, cap=2.0),
            filter_zero_variance_groups=True,
            source="Olmo Team 2025, Olmo 3 (arXiv 2512.13961) OlmoRL: no std, token-level "
            "loss, token TIS, clip-higher, zero-gradient filtering, no KL",
        ),
        Recipe(
            name="ppo",
            advantage_fn=GaeAdvantage(gamma=1.0, lam=0.95),
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            value_coef=0.5,
            value_clip=0.2,
            source="Schulman et al. 2017 (PPO) with GAE (Schulman et al. 2016); terminal "
            "outcome reward, gamma=1 for LLM episodes",
        ),
        Recipe(
            name="rloo",
            advantage_fn=GroupAdvantage(adv_lib.rloo_advantages),
            policy_loss_fn=losses.pg_loss,
            aggregation="seq_mean_token_sum",
            source="Ahmadian et al. 2024 (arXiv 2402.14740): REINFORCE with a leave-one-out "
            "baseline, the whole response as one action",
        ),
        Recipe(
            name="reinforce_pp",
            advantage_fn=TokenAdvantage(adv_lib.reinforce_pp_advantages),
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            source="Hu et al. 2025, REINFORCE++-baseline (arXiv 2501.03262)",
        ),
        Recipe(
            name="cispo",
            advantage_fn=_grpo_std,
            # eps_high is unpublished in MiniMax-M1; 4.0 (weights capped at 5) is our choice.
            policy_loss_fn=functools.partial(losses.cispo_loss, eps_low=None, eps_high=4.0),
            aggregation="token_mean",
            source="MiniMax 2025, MiniMax-M1 (arXiv 2506.13585)",
        ),
        Recipe(
            name="gspo",
            advantage_fn=_grpo_std,
            policy_loss_fn=functools.partial(losses.gspo_loss, eps_low=3e-4, eps_high=4e-4),
            aggregation="seq_mean_token_mean",
            source="Zheng et al. 2025, GSPO (arXiv 2507.18071)",
        ),
        Recipe(
            name="precision_rl",
            advantage_fn=_grpo_std,
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            correction=functools.partial(corrections.sequence_mis, cap=10.0),
            source="Qi et al. 2025, Precision-RL (arXiv 2510.26788): GRPO with sequence-level "
            "masked importance sampling; pair it with FP16 sampler and learner",
        ),
        Recipe(
            name="vineppo",
            advantage_fn=MonteCarloAdvantage(),
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            source="Kazemnejad et al. 2024, VinePPO (arXiv 2410.01679): PPO-clip without a critic, "
            "chunk advantages from Monte-Carlo values of K continuations per chunk start",
        ),
    )
}


def get_recipe(name: str, **overrides) -> Recipe:
    """Returns RECIPES[name], with fields replaced by `overrides`.

    Example: get_recipe("dr_grpo", constant_length=1024).

    Raises:
      ValueError listing the valid names (or fields) for an unknown one.
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}")
    fields = {field.name for field in dataclasses.fields(Recipe)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown Recipe field(s) {unknown}; valid fields: {', '.join(sorted(fields))}")
    return dataclasses.replace(RECIPES[name], **overrides)


def _check_step_inputs(recipe, rewards, mask, old_logp, sampler_logp, ref_logp, values) -> None:
    chex.assert_rank(rewards, 2)
    _checks.check_float(old_logp, 2)
    for optional in (sampler_logp, ref_logp, values):
        if optional is not None:
            _checks.check_float(optional, 2)
    _checks.check_same_shape(
        mask=mask, old_logp=old_logp, sampler_logp=sampler_logp, ref_logp=ref_logp, values=values
    )
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


def prepare_step_batch(
    recipe: Recipe,
    rewards,
    mask,
    old_logp,
    sampler_logp=None,
    *,
    ref_logp=None,
    values=None,
    truncated=None,
    correct=None,
    advantages=None,
) -> tuple[StepBatch, dict[str, jax.Array]]:
    """Everything a step needs before the model runs, on the FULL step batch.

    Order: overlong penalty -> response filters (truncation, zero-variance
    groups) -> advantages -> correction -> aggregation weights over
    mask * keep, so rejected tokens leave the denominators.

    The zero-variance group filter judges ACCURACY, as DAPO's dynamic sampling
    does (Yu et al. 2025, arXiv 2503.14476, eq. 11: keep groups with
    0 < |{correct}| < G): `correct` when given, else the rewards as passed in,
    before the overlong penalty. Judged on shaped rewards, an all-correct group
    whose lengths differ would be kept for its length penalties alone.

    Args:
      recipe: the objective.
      rewards: [P, G] scalar rewards (validated on the host when concrete).
      mask: [N, T] response mask, N = P * G, prompt-major rows.
      old_logp: [N, T] learner log-probs before the update (pi_old).
      sampler_logp: [N, T] rollout-engine log-probs (mu); needed by corrections.
      ref_logp: [N, T] reference log-probs; needed when recipe.kl_beta > 0.
      values: [N, T] critic values at rollout time; needed by GAE.
      truncated: [N] bool (no EOS); needed when recipe.mask_truncated.
      correct: [P, G] the graders' verdicts (bool or 0/1); what the zero-variance
        filter and its metric judge. None: judge `rewards` (before the penalty).
      advantages: [N, T] token advantages estimated outside the step; needed by, and
        only accepted with, `MonteCarloAdvantage` (VinePPO).
    Returns:
      (StepBatch, metrics): metrics are float32 scalars describing the step
      (rewards, filters, corrections, mismatch_* when sampler_logp is given).
    """
    _check_step_inputs(recipe, rewards, mask, old_logp, sampler_logp, ref_logp, values)
    rewards = _checks.to_float32(rewards)
    valid = _checks.valid_tokens(mask)
    response_mask = valid.astype(jnp.float32)
    lengths = aggregation.response_lengths(valid)
    outcomes = rewards if correct is None else _checks.to_float32(correct)
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
    if isinstance(recipe.advantage_fn, MonteCarloAdvantage):
        token_advantages = recipe.advantage_fn(rewards, response_mask, token_rewards=kl_rewards, advantages=advantages)
    elif advantages is not None:
        raise ValueError(f"advantages= was given, but recipe {recipe.name!r} estimates its own "
                         f"({recipe.advantage_fn}); only MonteCarloAdvantage (VinePPO) takes them")
    else:
        token_advantages = recipe.advantage_fn(rewards, response_mask, values=values, token_rewards=kl_rewards)
    has_sampler = sampler_logp is not None
    sampler_logp = _masked_constant(sampler_logp, response_mask) if has_sampler else old_logp
    if recipe.correction is None:
        correction = corrections.CorrectionOutput(response_mask, response_mask, jnp.zeros_like(response_mask))
    else:
        correction = recipe.correction(old_logp, sampler_logp, response_mask)

    loss_mask = response_mask * correction.keep
    metric_weights = aggregation.token_weights(response_mask, "token_mean")
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
    )
    metrics.update(
        num_loss_tokens=jnp.sum(loss_mask),
        filtered_token_fraction=1.0 - jnp.sum(response_mask) / jnp.maximum(jnp.sum(lengths), 1.0),
        correction_masked_fraction=jnp.sum(metric_weights * (1.0 - correction.keep)),
        correction_clipped_fraction=jnp.sum(metric_weights * correction.clipped),
        advantage_token_mean=jnp.sum(metric_weights * token_advantages.advantages),
    )
    if has_sampler:
        metrics.update(corrections.mismatch_metrics(old_logp, sampler_logp, response_mask))
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
    output = recipe.policy_loss_fn(
        logp, batch.old_logp, batch.advantages, batch.mask, sampler_logp=batch.sampler_logp
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
