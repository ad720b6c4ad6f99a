"""Recipes: registry, hand-computed step gradients, exact micro-batching and sharding."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm import core
from tests.core.batches import lengths_to_mask, random_batch

NAMES = ("grpo", "dr_grpo", "dapo", "olmo3", "ppo", "rloo", "reinforce_pp", "cispo", "gspo", "precision_rl", "dppo_tv",
         "dppo_kl", "clip_cov", "kl_cov", "gpg")


def recipe(name, **overrides):
    if name == "dr_grpo":
        overrides.setdefault("constant_length", 16)
    return core.get_recipe(name, **overrides)


def test_registry_holds_the_named_recipes():
    assert set(NAMES) <= set(core.RECIPES)
    for name in NAMES:
        assert core.RECIPES[name].name == name
        assert core.RECIPES[name].aggregation in core.AGGREGATION_MODES


def test_unknown_recipe_lists_valid_names():
    with pytest.raises(ValueError, match="'grpoo'.*grpo, dr_grpo, dapo, olmo3, ppo, rloo"):
        core.get_recipe("grpoo")
    with pytest.raises(ValueError, match="unknown Recipe field.*'eps'"):
        core.get_recipe("grpo", eps=0.1)
    with pytest.raises(ValueError, match="valid modes"):
        core.get_recipe("grpo", aggregation="mean")


def _on_policy_grad(rec, rewards, mask, logp, sampler_logp=None, **kwargs):
    batch, metrics = core.prepare_step_batch(rec, core.StepInputs(rewards, mask, logp, sampler_logp, **kwargs))
    grad = jax.grad(lambda lp: core.recipe_loss(rec, lp, batch)[0])(logp)
    return np.asarray(grad), batch, metrics


REWARDS = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
LENGTHS = np.array([1, 2, 3, 4])
MASK = lengths_to_mask(LENGTHS, 5)
LOGP = np.log(np.random.default_rng(0).uniform(0.2, 1.0, (4, 5))).astype(np.float32)
A_GRPO = np.array([1, -1, -1, 1]) * 0.5 / (np.sqrt(1 / 3) + 1e-6)  # ddof 1, eps 1e-6
A_CENTRED = np.array([0.5, -0.5, -0.5, 0.5])


@pytest.mark.parametrize("name, expected_row_grad", [
    ("grpo", -A_GRPO / (4 * LENGTHS)),  # -A_i / (N L_i)
    ("gspo", -A_GRPO / (4 * LENGTHS)),  # on-policy s_i = 1: same as GRPO
    ("dr_grpo", -A_CENTRED / (4 * 16)),  # -A_i / (N L_const)
    ("dapo", -A_GRPO / 10),  # -A_i / total tokens
    ("cispo", -A_GRPO / 10),
    ("olmo3", -A_CENTRED / 10),
    ("rloo", -(4 / 3) * A_CENTRED / 4),  # -A_rloo / N
])
def test_on_policy_gradient_matches_hand_formula(name, expected_row_grad):
    grad, _, _ = _on_policy_grad(recipe(name), REWARDS, MASK, LOGP, LOGP)
    np.testing.assert_allclose(grad, np.asarray(expected_row_grad)[:, None] * MASK, rtol=1e-5, atol=1e-8)


def test_zero_variance_groups_leave_the_denominator():
    rewards = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)  # second group is constant
    mask = lengths_to_mask([2, 3, 4, 1], 4)
    grad, batch, metrics = _on_policy_grad(recipe("dapo"), rewards, mask, LOGP[:, :4], LOGP[:, :4])
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    expected = np.array([-a, a, 0, 0])[:, None] / 5 * lengths_to_mask([2, 3, 0, 0], 4)  # 5 kept tokens
    np.testing.assert_allclose(grad, expected, rtol=1e-5)
    assert float(metrics["zero_variance_group_fraction"]) == 0.5
    assert float(metrics["filtered_token_fraction"]) == 0.5


MASK8 = lengths_to_mask([1, 2, 3, 4, 1, 2, 3, 4], 4)
LOGP8 = np.log(np.random.default_rng(1).uniform(0.2, 1.0, (8, 4))).astype(np.float32)


def test_zero_variance_filter_judges_accuracy_not_the_length_penalty():
    """DAPO keeps a group when 0 < #correct < G. Group 0 is all correct with lengths 1..4:
    the overlong penalty (L_max 4, buffer 2: 0, 0, -0.5, -1) makes its rewards differ, yet
    it must be dropped; group 1 (right, wrong, wrong, right) is kept."""
    rec = recipe("dapo", overlong=core.OverlongPenalty(max_length=4, buffer=2))
    rewards = np.array([[1, 1, 1, 1], [1, 0, 0, 1]], np.float32)
    batch, metrics = core.prepare_step_batch(rec, core.StepInputs(rewards, MASK8, LOGP8, LOGP8))
    weights = np.asarray(batch.loss_weights)
    np.testing.assert_array_equal(weights[:4], 0.0)  # the all-correct group leaves the loss
    np.testing.assert_allclose(weights[4:], MASK8[4:] / 10.0, rtol=1e-6)  # token mean over 1+2+3+4 kept tokens
    assert float(metrics["zero_variance_group_fraction"]) == 0.5
    # shaped outside core (e.g. a length reward): the verdicts passed as `correct` decide
    shaped = np.array([[1.0, 0.9, 0.8, 0.7], [0.9, -0.1, -0.2, 0.7]], np.float32)
    batch, metrics = core.prepare_step_batch(rec, core.StepInputs(shaped, MASK8, LOGP8, LOGP8, correct=rewards >= 1))
    np.testing.assert_array_equal(np.asarray(batch.loss_weights)[:4], 0.0)
    assert np.all(np.asarray(batch.loss_weights)[4:][MASK8[4:] > 0] > 0)
    assert float(metrics["zero_variance_group_fraction"]) == 0.5
    with pytest.raises(ValueError, match="correct shape"):
        core.prepare_step_batch(rec, core.StepInputs(shaped, MASK8, LOGP8, LOGP8, correct=np.ones((1, 8))))


def test_olmo3_token_tis_weights_the_gradient():
    sampler = LOGP.copy()
    sampler[0, 0] -= np.log(3.0)  # pi_old / mu = 3 -> truncated to 2
    sampler[1, 1] += np.log(2.0)  # ratio 1/2
    grad, _, metrics = _on_policy_grad(recipe("olmo3"), REWARDS, MASK, LOGP, sampler)
    weights = np.ones((4, 5))
    weights[0, 0], weights[1, 1] = 2.0, 0.5
    np.testing.assert_allclose(grad, -A_CENTRED[:, None] * weights / 10 * MASK, rtol=1e-5)
    assert float(metrics["correction_clipped_fraction"]) == pytest.approx(0.1)


def test_precision_rl_rejected_sequences_leave_the_denominator():
    sampler = LOGP.copy()
    sampler[3, :4] -= np.log(2.0)  # rho_3 = 2^4 = 16 > 10: rejected
    sampler[1, :2] -= np.log(1.5)  # rho_1 = 2.25: kept, weighted
    grad, batch, metrics = _on_policy_grad(recipe("precision_rl"), REWARDS, MASK, LOGP, sampler)
    rho = np.array([1.0, 2.25, 1.0, 0.0])
    kept_tokens = 1 + 2 + 3
    np.testing.assert_allclose(grad, -(rho * A_GRPO)[:, None] / kept_tokens * MASK, rtol=1e-5)
    assert float(metrics["correction_masked_fraction"]) == pytest.approx(0.4)
    assert "mismatch_k1" in metrics


def test_ppo_uses_gae_on_terminal_reward():
    rewards = np.array([[1.0, 0.0]], np.float32)
    mask = lengths_to_mask([2, 1], 2)
    values = np.full((2, 2), 0.5, np.float32)
    logp = LOGP[:2, :2]
    rec = recipe("ppo")  # gamma 1, lambda 0.95
    batch, _ = core.prepare_step_batch(rec, core.StepInputs(rewards, mask, logp, values=values))
    # row 0: deltas (0 + .5 - .5, 1 - .5) -> A = (.95 * .5, .5); row 1: delta = 0 - .5
    np.testing.assert_allclose(batch.advantages, [[0.475, 0.5], [-0.5, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(batch.returns, [[0.975, 1.0], [0.0, 0.0]], rtol=1e-6)
    new_values = values + 0.1
    grads = jax.grad(lambda lp, v: core.recipe_loss(rec, lp, batch, values=v)[0], argnums=(0, 1))(logp, new_values)
    np.testing.assert_allclose(grads[0], -np.asarray(batch.advantages) / 3, rtol=1e-6)
    # value loss 0.5 (V - R)^2 inside the clip range, weighted 1/3 per token, coefficient 0.5
    np.testing.assert_allclose(grads[1], 0.5 * (new_values - batch.returns) / 3 * mask, rtol=1e-5)
    with pytest.raises(ValueError, match="critic values"):
        core.prepare_step_batch(rec, core.StepInputs(rewards, mask, logp))


def test_kl_term_in_the_loss():
    rec = recipe("grpo", kl_beta=0.04, kl_estimator="k3")
    ref = LOGP - 0.3
    grad_with_kl, _, _ = _on_policy_grad(rec, REWARDS, MASK, LOGP, ref_logp=ref)
    grad_without, _, _ = _on_policy_grad(recipe("grpo"), REWARDS, MASK, LOGP)
    # d k3 / d log pi = 1 - e^x with x = ref - log pi = -0.3; GRPO weights 1 / (N L_i)
    expected = 0.04 * (1 - np.exp(-0.3)) / (4 * LENGTHS)[:, None] * MASK
    np.testing.assert_allclose(grad_with_kl - grad_without, expected, rtol=1e-4, atol=1e-9)
    with pytest.raises(ValueError, match="ref_logp"):
        core.prepare_step_batch(rec, core.StepInputs(REWARDS, MASK, LOGP))


def test_step_input_errors():
    with pytest.raises(ValueError, match=r"rewards\[0, 2\] = nan"):
        core.prepare_step_batch(recipe("grpo"), core.StepInputs(np.array([[1.0, 0.0, np.nan, 1.0]]), MASK, LOGP))
    with pytest.raises(ValueError, match=r"mask has shape \(4, 5\).*old_logp has shape \(4, 6\)"):
        core.prepare_step_batch(recipe("grpo"), core.StepInputs(REWARDS, MASK, np.zeros((4, 6), np.float32)))
    with pytest.raises(ValueError, match=r"rewards shape \(2, 4\).*mask shape \(4, 5\)"):
        core.prepare_step_batch(recipe("grpo"), core.StepInputs(np.zeros((2, 4)), MASK, LOGP))
    with pytest.raises(ValueError, match="constant_length"):
        core.prepare_step_batch(core.get_recipe("dr_grpo"), core.StepInputs(REWARDS, MASK, LOGP))
    with pytest.raises(ValueError, match="sampler_logp"):
        core.prepare_step_batch(recipe("olmo3"), core.StepInputs(REWARDS, MASK, LOGP))
    with pytest.raises(ValueError, match="truncated"):
        core.prepare_step_batch(recipe("grpo", mask_truncated=True), core.StepInputs(REWARDS, MASK, LOGP))


def test_overlong_penalty_and_truncation_masking():
    rec = recipe("dapo", overlong=core.OverlongPenalty(max_length=5, buffer=2), mask_truncated=True,
                 filter_zero_variance_groups=False)
    rewards = np.ones((1, 4), np.float32)
    batch, metrics = core.prepare_step_batch(rec, core.StepInputs(rewards, MASK, LOGP, LOGP,
                                                                  truncated=np.array([False, False, False, True])))
    # lengths 1..4 with L_max 5, buffer 2: penalties 0, 0, 0, -0.5 -> rewards 1, 1, 1, 0.5
    assert float(metrics["reward_mean"]) == pytest.approx(3.5 / 4)
    assert float(metrics["overlong_penalty_mean"]) == pytest.approx(-0.5 / 4)
    np.testing.assert_array_equal(np.asarray(batch.loss_weights)[3], 0.0)
    np.testing.assert_allclose(np.asarray(batch.loss_weights).sum(), 1.0, rtol=1e-6)


def _random_step(name, seed=11):
    data = random_batch(seed, num_prompts=4, group_size=4, width=8)
    rec = recipe(name)
    kwargs = dict(values=data.values) if name == "ppo" else {}
    batch, _ = core.prepare_step_batch(rec, core.StepInputs(data.rewards, data.mask, data.old_logp, data.sampler_logp,
                                                            **kwargs))
    values = jnp.asarray(data.values + 0.3) if name == "ppo" else None
    return rec, data, batch, values


@pytest.mark.parametrize("name", NAMES)
def test_micro_batches_and_sharding_equal_one_pass(name):
    rec, data, batch, values = _random_step(name)

    @jax.jit
    def loss_and_grads(logp, batch, values):
        (loss, metrics), grads = jax.value_and_grad(
            lambda lp, v: core.recipe_loss(rec, lp, batch, values=v), argnums=(0, 1), has_aux=True)(logp, values)
        return loss, metrics, grads

    loss, metrics, grads = loss_and_grads(data.logp, batch, values)
    assert float(jnp.max(jnp.abs(grads[0]))) > 0

    micro_loss, micro_metrics, micro_grads = 0.0, {k: 0.0 for k in metrics}, []
    for k, part in enumerate(core.micro_batches(batch, 4)):
        rows = slice(4 * k, 4 * (k + 1))
        part_values = None if values is None else values[rows]
        l, m, g = loss_and_grads(data.logp[rows], part, part_values)
        micro_loss += float(l)
        micro_metrics = {key: micro_metrics[key] + float(m[key]) for key in m}
        micro_grads.append(g)
    assert abs(micro_loss - float(loss)) <= 1e-6
    grad_logp = np.concatenate([np.asarray(g[0]) for g in micro_grads])
    assert np.max(np.abs(grad_logp - np.asarray(grads[0]))) <= 1e-6
    for key, value in metrics.items():
        assert abs(micro_metrics[key] - float(value)) <= 1e-6, key
    if values is not None:
        grad_values = np.concatenate([np.asarray(g[1]) for g in micro_grads])
        assert np.max(np.abs(grad_values - np.asarray(grads[1]))) <= 1e-6

    rows = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch", None))
    shard = functools.partial(jax.device_put, device=rows)
    sharded = loss_and_grads(shard(data.logp), jax.tree.map(shard, batch), None if values is None else shard(values))
    assert abs(float(sharded[0]) - float(loss)) <= 1e-6
    assert float(jnp.max(jnp.abs(sharded[2][0] - grads[0]))) <= 1e-6


def test_clip_fraction_metric_is_token_mean_of_clipped_tokens():
    rec, data, batch, _ = _random_step("dapo", seed=12)
    _, metrics = core.recipe_loss(rec, data.logp, batch)
    ratio = np.exp(data.logp - data.old_logp)
    adv = np.asarray(batch.advantages)
    clipped = ((adv > 0) & (ratio > 1.28)) | ((adv < 0) & (ratio < 0.8))
    kept = np.asarray(batch.mask) != 0
    assert float(metrics["clip_fraction"]) == pytest.approx(clipped[kept].mean(), abs=1e-6)


def test_recipe_is_a_valid_static_argument():
    rec, data, batch, _ = _random_step("gspo", seed=14)
    jitted = jax.jit(core.recipe_loss, static_argnums=0)
    assert float(jitted(rec, data.logp, batch)[0]) == float(jitted(core.get_recipe("gspo"), data.logp, batch)[0])


def test_prepare_step_batch_under_jit_matches_eager():
    rec = recipe("olmo3")
    data = random_batch(13)
    inputs = core.StepInputs(data.rewards, data.mask, data.old_logp, data.sampler_logp)
    eager, eager_metrics = core.prepare_step_batch(rec, inputs)
    jitted, jitted_metrics = jax.jit(functools.partial(core.prepare_step_batch, rec))(inputs)  # one pytree
    for a, b in zip(eager, jitted):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for key in eager_metrics:
        np.testing.assert_allclose(eager_metrics[key], jitted_metrics[key], rtol=1e-5, atol=1e-6, err_msg=key)
