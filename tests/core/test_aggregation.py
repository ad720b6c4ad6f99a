"""Aggregation: closed-form gradients, micro-batch / sharding exactness, padding, empties."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm import core
from tests.core.batches import lengths_to_mask, poison_padding, random_batch

VARIANTS = dict(with_jit=True, without_jit=True)
MODES = core.AGGREGATION_MODES
CONSTANT_LENGTH = 10.0

# Lengths (3, 1, 2, 0) padded to width 4: N = 3 non-empty responses, 6 tokens.
LENGTHS = [3, 1, 2, 0]
ADVANTAGES = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
# Hand-written w_it of a valid token of each row, per mode.
EXPECTED_ROW_WEIGHT = {
    "seq_mean_token_mean": [1 / 9, 1 / 3, 1 / 6, 0.0],  # 1 / (N L_i)
    "token_mean": [1 / 6] * 3 + [0.0],  # 1 / sum m
    "seq_mean_token_sum": [1 / 3] * 3 + [0.0],  # 1 / N
    "constant": [1 / 30] * 3 + [0.0],  # 1 / (N L_const)
}


def _pg_objective(logp, advantages, mask, weights):
    return core.aggregate(core.pg_loss(logp, logp, advantages, mask).loss, weights)


class WeightsTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_token_weights_match_hand_values(self):
        mask = lengths_to_mask(LENGTHS, 4)
        for mode in MODES:
            weights = self.variant(functools.partial(
                core.token_weights, mode=mode, constant_length=CONSTANT_LENGTH))(mask)
            expected = np.asarray(EXPECTED_ROW_WEIGHT[mode])[:, None] * mask
            np.testing.assert_allclose(weights, expected, rtol=1e-6, err_msg=mode)
            assert weights.dtype == jnp.float32

    @chex.variants(**VARIANTS)
    def test_gradient_of_pg_loss_is_minus_weight_times_advantage(self):
        """docs/objectives.md#length-bias: d/d log pi_it of sum_it w_it (-A_i log pi_it) = -w_it A_i."""
        mask = lengths_to_mask(LENGTHS, 4)
        logp = np.log(np.random.default_rng(0).uniform(0.1, 1.0, (4, 4))).astype(np.float32)
        adv = core.broadcast_to_tokens(ADVANTAGES.reshape(2, 2), mask)
        for mode in MODES:
            weights = core.token_weights(mask, mode, constant_length=CONSTANT_LENGTH)
            grad = self.variant(jax.grad(_pg_objective))(logp, adv, mask, weights)
            expected = -(np.asarray(EXPECTED_ROW_WEIGHT[mode]) * ADVANTAGES)[:, None] * mask
            np.testing.assert_allclose(grad, expected, rtol=1e-6, err_msg=mode)
            # The bias diagnostic states the same closed form.
            implied = core.implied_token_weight(
                np.array(LENGTHS, np.float32), ADVANTAGES, mode, num_responses=3,
                constant_length=CONSTANT_LENGTH)
            np.testing.assert_allclose(-implied[:, None] * mask, expected, rtol=1e-6, err_msg=mode)

    def test_dr_grpo_weight_ignores_length_and_grpo_weight_is_one_over_length(self):
        lengths = [1, 2, 5, 8]
        mask = lengths_to_mask(lengths, 8)
        adv = np.ones((4, 8), np.float32) * mask  # the same advantage for every response
        logp = np.full((4, 8), -1.0, np.float32)

        def per_token_push(mode):
            weights = core.token_weights(mask, mode, constant_length=64)
            grad = np.asarray(jax.grad(_pg_objective)(logp, adv, mask, weights))
            return -grad[:, 0]  # first token of each row (all rows have one)

        constant = per_token_push("constant")
        np.testing.assert_allclose(constant, np.full(4, 1 / (4 * 64)), rtol=1e-6)
        grpo = per_token_push("seq_mean_token_mean")
        np.testing.assert_allclose(grpo * np.asarray(lengths), np.full(4, 1 / 4), rtol=1e-6)
        np.testing.assert_allclose(grpo[0] / grpo, np.asarray(lengths, np.float32), rtol=1e-6)


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="'seq_mean'.*seq_mean_token_mean, token_mean, seq_mean_token_sum, constant"):
        core.token_weights(np.ones((1, 2)), "seq_mean")


def test_constant_mode_needs_explicit_length():
    with pytest.raises(ValueError, match="constant_length"):
        core.token_weights(np.ones((1, 2)), "constant")
    with pytest.raises(ValueError, match="constant_length"):
        core.token_weights(np.ones((1, 2)), "constant", constant_length=0)


def test_aggregate_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 5\)"):
        core.aggregate(np.zeros((2, 3), np.float32), np.zeros((2, 5), np.float32))


@pytest.mark.parametrize("mode", MODES)
def test_empty_responses_do_not_divide_by_zero(mode):
    for lengths in ([0, 0, 0, 0], [0, 4, 0, 2]):
        mask = lengths_to_mask(lengths, 4)
        weights = core.token_weights(mask, mode, constant_length=CONSTANT_LENGTH)
        assert np.all(np.isfinite(weights))
        assert np.all(np.asarray(weights)[mask == 0] == 0)
        logp = np.full((4, 4), -1.0, np.float32)
        value, grad = jax.value_and_grad(_pg_objective)(logp, np.ones((4, 4), np.float32), mask, weights)
        assert np.isfinite(value) and np.all(np.isfinite(grad))
    assert float(value) == pytest.approx(EXPECTED_ROW_WEIGHT_EMPTY[mode])


# lengths (0, 4, 0, 2), A = 1, log pi = -1: loss = sum_it w_it; N = 2, 6 tokens.
EXPECTED_ROW_WEIGHT_EMPTY = {
    "seq_mean_token_mean": 1.0,
    "token_mean": 1.0,
    "seq_mean_token_sum": 6 / 2,
    "constant": 6 / (2 * CONSTANT_LENGTH),
}


@pytest.mark.parametrize("mode", MODES)
def test_masking_a_row_equals_removing_it(mode):
    mask = lengths_to_mask([3, 1, 2, 4, 4, 2], 4)
    masked = mask.copy()
    masked[2] = 0
    with_masked_row = np.asarray(core.token_weights(masked, mode, constant_length=CONSTANT_LENGTH))
    removed = np.asarray(core.token_weights(np.delete(mask, 2, axis=0), mode, constant_length=CONSTANT_LENGTH))
    np.testing.assert_allclose(np.delete(with_masked_row, 2, axis=0), removed, rtol=1e-7)
    assert np.all(with_masked_row[2] == 0)


def _ppo_objective(logp, old_logp, advantages, mask, weights):
    out = core.ppo_clip_loss(logp, old_logp, advantages, mask, eps_low=0.2, eps_high=0.28)
    return core.aggregate(out.loss, weights)


def _step(seed, mode, width=8):
    batch = random_batch(seed, num_prompts=4, group_size=4, width=width, binary_rewards=False)
    adv = np.asarray(core.broadcast_to_tokens(core.grpo_advantages(batch.rewards), batch.mask))
    weights = np.asarray(core.token_weights(batch.mask, mode, constant_length=CONSTANT_LENGTH))
    return batch.logp, batch.old_logp, adv, batch.mask, weights


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_and_sharding_equal_one_pass(mode):
    args = _step(7, mode)
    value_and_grad = jax.jit(jax.value_and_grad(_ppo_objective))
    full_value, full_grad = value_and_grad(*args)
    assert float(jnp.max(jnp.abs(full_grad))) > 0

    for k in (2, 4):
        parts = [value_and_grad(*(np.split(a, k)[j] for a in args)) for j in range(k)]
        micro_value = sum(float(v) for v, _ in parts)
        micro_grad = np.concatenate([np.asarray(g) for _, g in parts])
        assert abs(micro_value - float(full_value)) <= 1e-6
        assert np.max(np.abs(micro_grad - np.asarray(full_grad))) <= 1e-6

    devices = jax.devices()
    assert len(devices) == 8, "tests/conftest.py should provide 8 fake CPU devices"
    rows = NamedSharding(Mesh(np.array(devices), ("batch",)), PartitionSpec("batch", None))
    sharded_args = [jax.device_put(a, rows) for a in args]
    sharded_value, sharded_grad = value_and_grad(*sharded_args)
    assert sharded_grad.sharding.is_equivalent_to(rows, 2)
    assert abs(float(sharded_value) - float(full_value)) <= 1e-6
    assert float(jnp.max(jnp.abs(sharded_grad - full_grad))) <= 1e-6


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "token_mean"])
def test_per_micro_batch_denominators_would_differ(mode):
    """The failure the global weights prevent: normalising inside each micro-batch."""
    logp, old, adv, mask, weights = _step(8, mode)
    full = float(_ppo_objective(logp, old, adv, mask, weights))
    local = sum(float(_ppo_objective(*(np.split(a, 2)[j] for a in (logp, old, adv, mask)),
                                     core.token_weights(np.split(mask, 2)[j], mode)))
                for j in range(2))
    assert abs(local - full) > 1e-3


@pytest.mark.parametrize("mode", MODES)
def test_padding_columns_change_nothing(mode):
    logp, old, adv, mask, weights = _step(9, mode)
    value_and_grad = jax.value_and_grad(_ppo_objective)
    value, grad = value_and_grad(logp, old, adv, mask, weights)

    def pad(x, fill):
        return np.concatenate([x, np.full((x.shape[0], 3), fill, x.dtype)], axis=1)

    padded_mask = pad(mask, 0.0)
    padded_weights = core.token_weights(padded_mask, mode, constant_length=CONSTANT_LENGTH)
    padded_value, padded_grad = value_and_grad(
        pad(logp, np.nan), pad(old, np.inf), pad(adv, np.nan), padded_mask, padded_weights)
    # Equal up to float32 summation order (the reduction runs over a wider array).
    np.testing.assert_allclose(float(padded_value), float(value), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(padded_grad)[:, :8], grad, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(padded_grad)[:, 8:], 0.0)


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_aggregate_ignores_non_finite_loss_where_weight_is_zero(poison):
    mask = lengths_to_mask([2, 0, 3], 3)
    weights = core.token_weights(mask, "token_mean")
    loss = poison_padding(np.arange(9, dtype=np.float32).reshape(3, 3), mask, poison)
    value, grad = jax.value_and_grad(core.aggregate)(loss, weights)
    assert float(value) == pytest.approx((0 + 1 + 6 + 7 + 8) / 5)
    np.testing.assert_array_equal(grad, np.asarray(weights))


def test_aggregate_of_bf16_loss_sums_in_float32():
    rng = np.random.default_rng(0)
    loss = jnp.asarray(rng.uniform(0, 1, (64, 256)), jnp.bfloat16)
    weights = core.token_weights(np.ones((64, 256)), "token_mean")
    out = core.aggregate(loss, weights)
    assert out.dtype == jnp.float32
    expected = np.mean(np.asarray(loss.astype(jnp.float32), np.float64))
    assert abs(float(out) - expected) < 1e-6
