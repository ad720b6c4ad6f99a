"""Policy losses: hand values, gradients, second (sequence-level) formulations, masking."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from tests.core.batches import poison_padding, random_batch

VARIANTS = dict(with_jit=True, without_jit=True)

# Every policy loss with its hyperparameters bound: they share one call signature.
BOUND_LOSSES = {
    "pg": core.pg_loss,
    "ppo_clip": functools.partial(core.ppo_clip_loss, eps_low=0.2, eps_high=0.28, dual_clip=3.0),
    "cispo": functools.partial(core.cispo_loss, eps_high=0.5),
    "gspo": core.gspo_loss,
    "gmpo": core.gmpo_loss,
    "is_pg_sequence": functools.partial(core.is_pg_sequence_loss, cap=2.0),
    "sapo": functools.partial(core.sapo_loss, tau_pos=1.0, tau_neg=1.05),
    "dppo_tv": functools.partial(core.dppo_tv_loss, threshold=0.15),
    "dppo_kl": functools.partial(core.dppo_kl_loss, threshold=0.05),
    # the token selection comes from prepare_step_batch; here: the tokens with A > 0.5
    "clip_cov": lambda lp, old, adv, mask, **kw: core.clip_cov_loss(lp, old, adv, mask, selected=adv > 0.5, **kw),
    "kl_cov": lambda lp, old, adv, mask, **kw: core.kl_cov_loss(lp, old, adv, mask, selected=adv > 0.5, **kw),
}


def test_every_registered_loss_is_covered():
    assert set(BOUND_LOSSES) == set(core.POLICY_LOSSES)


def _value_and_grad(loss_fn, logp, old_logp, advantages, mask, **kwargs):
    def total(lp):
        return jnp.sum(loss_fn(lp, old_logp, advantages, mask, **kwargs).loss)
    return jax.value_and_grad(total)(logp)


class HandValuesTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_pg_loss(self):
        logp = np.array([[-1.0, -2.0]], np.float32)
        adv = np.array([[2.0, 2.0]], np.float32)
        mask = np.array([[1.0, 0.0]], np.float32)
        out = self.variant(core.pg_loss)(logp, logp, adv, mask)
        np.testing.assert_array_equal(out.loss, [[2.0, 0.0]])
        np.testing.assert_array_equal(out.clipped, [[0.0, 0.0]])
        _, grad = _value_and_grad(core.pg_loss, logp, logp, adv, mask)
        np.testing.assert_array_equal(grad, [[-2.0, 0.0]])

    @chex.variants(**VARIANTS)
    def test_ppo_clip_higher_and_dual_clip(self):
        ratio = np.array([[1.5, 0.5, 1.5, 0.5, 5.0, 2.0]], np.float32)
        adv = np.array([[1.0, 1.0, -1.0, -1.0, -1.0, -1.0]], np.float32)
        old = np.full_like(ratio, -1.0)
        logp = old + np.log(ratio)
        mask = np.ones_like(ratio)
        fn = functools.partial(core.ppo_clip_loss, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
        out = self.variant(fn)(logp, old, adv, mask)
        # A>0: min(1.5, 1.28) -> 1.28 (clipped); min(.5, .8) -> .5.
        # A<0: max(1.5, 1.28) -> 1.5; max(.5, .8) -> .8 (clipped); 5 -> dual bound 3; 2 < 3 stays.
        np.testing.assert_allclose(out.loss, [[-1.28, -0.5, 1.5, 0.8, 3.0, 2.0]], rtol=1e-6)
        np.testing.assert_array_equal(out.clipped, [[1, 0, 0, 1, 1, 0]])
        _, grad = _value_and_grad(fn, logp, old, adv, mask)
        # d(-A rho)/d log pi = -A rho where unclipped, 0 where clipped.
        np.testing.assert_allclose(grad, [[0.0, -0.5, 1.5, 0.0, 0.0, 2.0]], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_ppo_on_policy_gradient_is_minus_advantage(self):
        logp = np.array([[-0.3, -2.0, -0.7]], np.float32)
        adv = np.array([[0.5, -1.5, 2.0]], np.float32)
        out = self.variant(core.ppo_clip_loss)(logp, logp, adv, np.ones_like(logp))
        np.testing.assert_allclose(out.loss, -adv, rtol=1e-6)
        _, grad = _value_and_grad(core.ppo_clip_loss, logp, logp, adv, np.ones_like(logp))
        np.testing.assert_allclose(grad, -adv, rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_cispo_weight_is_clipped_and_detached(self):
        old = np.array([[-1.0, -1.0]], np.float32)
        logp = old + np.log(np.array([[1.5, 0.5]], np.float32))
        adv = np.array([[1.0, -2.0]], np.float32)
        mask = np.ones_like(old)
        fn = functools.partial(core.cispo_loss, eps_high=0.2)
        out = self.variant(fn)(logp, old, adv, mask)
        # weights: min(1.5, 1.2) = 1.2 (clipped); 0.5 (no lower bound)
        np.testing.assert_allclose(out.loss, [[-1.2 * logp[0, 0], 0.5 * 2.0 * logp[0, 1]]], rtol=1e-6)
        np.testing.assert_array_equal(out.clipped, [[1.0, 0.0]])
        _, grad = _value_and_grad(fn, logp, old, adv, mask)
        np.testing.assert_allclose(grad, [[-1.2, 1.0]], rtol=1e-6)
        out = core.cispo_loss(logp, old, adv, mask, eps_high=0.2, eps_low=0.3)
        np.testing.assert_allclose(out.loss[0, 1], 0.7 * 2.0 * logp[0, 1], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_gspo_hand_values(self):
        old = np.array([[-1.0, -2.0, -3.0]], np.float32)
        logp = old + np.array([[0.1, 0.3, 9.0]], np.float32)  # third token is padding
        adv = np.array([[1.0, 1.0, 1.0]], np.float32)
        mask = np.array([[1.0, 1.0, 0.0]], np.float32)
        s = np.exp(0.2)  # exp(mean(0.1, 0.3))
        out = self.variant(core.gspo_loss)(logp, old, adv, mask)  # eps_high 4e-4: clipped
        np.testing.assert_allclose(out.loss, [[-1.0004, -1.0004, 0.0]], rtol=1e-6)
        np.testing.assert_array_equal(out.clipped, [[1.0, 1.0, 0.0]])
        wide = functools.partial(core.gspo_loss, eps_low=1.0, eps_high=1.0)
        out = self.variant(wide)(logp, old, adv, mask)
        np.testing.assert_allclose(out.loss, [[-s, -s, 0.0]], rtol=1e-6)
        _, grad = _value_and_grad(wide, logp, old, adv, mask)
        np.testing.assert_allclose(grad, [[-s, -s, 0.0]], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_gmpo_hand_values(self):
        old = np.zeros((2, 2), np.float32)
        logp = np.array([[0.5, -0.1], [0.5, -0.1]], np.float32)
        adv = np.array([[1.0, 1.0], [-1.0, -1.0]], np.float32)
        out = self.variant(core.gmpo_loss)(logp, old, adv, np.ones_like(old))
        # A > 0 keeps min(lr, clip(lr, -.4, .4)): (0.4, -0.1) -> mean 0.15
        # A < 0 keeps max: (0.5, -0.1) -> mean 0.2
        np.testing.assert_allclose(out.loss, [[-np.exp(0.15)] * 2, [np.exp(0.2)] * 2], rtol=1e-6)
        np.testing.assert_array_equal(out.clipped, [[1.0, 0.0], [0.0, 0.0]])

    @chex.variants(**VARIANTS)
    def test_is_pg_sequence_weight_and_cap(self):
        logp = np.array([[-1.0, -2.0]], np.float32)
        mu = np.array([[-1.5, -2.5]], np.float32)  # log rho = 1
        adv = np.array([[1.0, 1.0]], np.float32)
        mask = np.ones_like(logp)
        for cap, weight, clipped in ((2.0, 2.0, 1.0), (5.0, np.e, 0.0)):
            fn = functools.partial(core.is_pg_sequence_loss, cap=cap)
            out = self.variant(lambda a, b, c, d: fn(a, b, c, d, sampler_logp=mu))(logp, logp, adv, mask)
            np.testing.assert_allclose(out.loss, -weight * logp, rtol=1e-6)
            np.testing.assert_array_equal(out.clipped, [[clipped, clipped]])
            _, grad = _value_and_grad(fn, logp, logp, adv, mask, sampler_logp=mu)
            np.testing.assert_allclose(grad, [[-weight, -weight]], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_clipped_value_loss(self):
        values = np.array([[1.5, 1.1]], np.float32)
        old = np.array([[1.0, 1.0]], np.float32)
        returns = np.array([[2.0, 2.0]], np.float32)
        mask = np.ones_like(values)
        out = self.variant(core.clipped_value_loss)(values, old, returns, mask)
        # token 0: max((1.5-2)^2, (1.2-2)^2) / 2 = 0.32; token 1: 0.9^2 / 2
        np.testing.assert_allclose(out, [[0.32, 0.405]], rtol=1e-6)
        grad = jax.grad(lambda v: jnp.sum(core.clipped_value_loss(v, old, returns, mask)))(values)
        np.testing.assert_allclose(grad, [[0.0, -0.9]], rtol=1e-5)


def _gspo_sequence_form(logp, old, adv_seq, mask, eps_low, eps_high):
    """GSPO as written in the paper: one ratio and one clipped term per sequence."""
    length = mask.sum(1)
    s = jnp.exp(jnp.sum(mask * (logp - old), axis=1) / length)
    return jnp.mean(jnp.maximum(-adv_seq * s, -adv_seq * jnp.clip(s, 1 - eps_low, 1 + eps_high)))


def _gmpo_sequence_form(logp, old, adv_seq, mask, eps):
    """GMPO as written in the paper: -A (prod_t sign-aware clipped ratio)^(1/L)."""
    lr = logp - old
    sign = jnp.sign(adv_seq)[:, None]
    chosen = sign * jnp.minimum(sign * lr, sign * jnp.clip(lr, -eps, eps))
    ratio = jnp.exp(jnp.sum(mask * chosen, axis=1) / mask.sum(1))
    return jnp.mean(-adv_seq * ratio)


@pytest.mark.parametrize("which", ["gspo", "gmpo"])
def test_token_form_equals_sequence_form(which):
    batch = random_batch(3, lengths=[3, 5, 8, 1, 2, 7, 6, 4], num_prompts=2, group_size=4)
    adv_seq = core.grpo_advantages(batch.rewards + np.arange(4) * 0.1).reshape(-1)
    adv = core.broadcast_to_tokens(adv_seq.reshape(2, 4), batch.mask)
    weights = core.token_weights(batch.mask, "seq_mean_token_mean")
    if which == "gspo":
        # wide clip range on half the problem, tight on the other, so both branches occur
        token_fn = functools.partial(core.gspo_loss, eps_low=0.05, eps_high=0.1)
        seq_fn = functools.partial(_gspo_sequence_form, eps_low=0.05, eps_high=0.1)
    else:
        token_fn = functools.partial(core.gmpo_loss, eps_low=0.25, eps_high=0.25)
        seq_fn = functools.partial(_gmpo_sequence_form, eps=0.25)
    token_value, token_grad = jax.value_and_grad(
        lambda lp: core.aggregate(token_fn(lp, batch.old_logp, adv, batch.mask).loss, weights))(batch.logp)
    seq_value, seq_grad = jax.value_and_grad(
        lambda lp: seq_fn(lp, batch.old_logp, adv_seq, batch.mask))(jnp.asarray(batch.logp))
    np.testing.assert_allclose(token_value, seq_value, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(token_grad, seq_grad * batch.mask, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(BOUND_LOSSES))
def test_nan_padding_gives_zero_value_and_gradient(name):
    loss_fn = BOUND_LOSSES[name]
    batch = random_batch(4, num_prompts=2, lengths=[0, 3, 8, 1, 5, 2, 7, 4])
    adv = core.broadcast_to_tokens(core.grpo_advantages(batch.rewards), batch.mask)
    weights = core.token_weights(batch.mask, "token_mean")

    def value_and_grad(logp, old, adv, sampler):
        return jax.jit(jax.value_and_grad(lambda lp: core.aggregate(
            loss_fn(lp, old, adv, batch.mask, sampler_logp=sampler).loss, weights)))(logp)

    clean = value_and_grad(batch.logp, batch.old_logp, np.asarray(adv), batch.sampler_logp)
    for poison in (np.nan, np.inf, -np.inf):
        dirty = value_and_grad(*(poison_padding(np.asarray(x), batch.mask, poison) for x in (
            batch.logp, batch.old_logp, adv, batch.sampler_logp)))
        assert np.isfinite(dirty[0]) and dirty[0] == clean[0]
        np.testing.assert_array_equal(dirty[1], clean[1])
        assert np.all(np.asarray(dirty[1])[batch.mask == 0] == 0.0)


@pytest.mark.parametrize("name", sorted(BOUND_LOSSES))
def test_old_and_sampler_logp_are_constants(name):
    batch = random_batch(5, num_prompts=1)
    adv = core.broadcast_to_tokens(core.dr_grpo_advantages(batch.rewards + np.arange(4)), batch.mask)
    loss_fn = BOUND_LOSSES[name]
    grads = jax.grad(lambda old, mu: jnp.sum(loss_fn(batch.logp, old, adv, batch.mask, sampler_logp=mu).loss),
                     argnums=(0, 1))(batch.old_logp, batch.sampler_logp)
    for grad in grads:
        np.testing.assert_array_equal(grad, np.zeros_like(grad))


def test_mismatched_shapes_name_both_shapes():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"logp has shape \(2, 3\).*mask has shape \(2, 4\)"):
        core.pg_loss(x, x, x, np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 3\)"):
        core.ppo_clip_loss(x, np.zeros((3, 3), np.float32), x, np.ones((2, 3)))


def test_rank_and_dtype_checked_at_the_door():
    with pytest.raises(AssertionError, match="rank"):
        core.pg_loss(np.zeros(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32), np.ones(3))
    ints = np.zeros((1, 2), np.int32)
    with pytest.raises(AssertionError, match="type"):
        core.pg_loss(ints, ints, ints, np.ones((1, 2)))


def test_bad_hyperparameters():
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError, match="dual_clip"):
        core.ppo_clip_loss(x, x, x, np.ones((1, 2)), dual_clip=0.5)
    with pytest.raises(ValueError, match="eps_low"):
        core.ppo_clip_loss(x, x, x, np.ones((1, 2)), eps_low=-0.1)
    with pytest.raises(ValueError, match="cap"):
        core.is_pg_sequence_loss(x, x, x, np.ones((1, 2)), cap=0.0)
