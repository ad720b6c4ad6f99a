"""DPPO (TV, KL), Clip-Cov, KL-Cov and GPG: hand values, an independent numpy formulation on random
inputs (values and gradients), the global token selection's independence of the micro-batch
split, and the config fields that reach them (SAPO's temperatures included)."""
import functools
import math

import jax
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides
from jaxrl_llm.train.plan import plan_run
from tests.core.batches import random_batch


def grad_logp(loss_fn, logp, old, adv, mask, **kw):
    return np.asarray(jax.grad(lambda x: loss_fn(x, old, adv, mask, **kw).loss.sum())(logp))


# ------------------------------------------------------------------------------------------- DPPO


def test_dppo_tv_hand_values():
    old = np.log(np.array([[0.5, 0.5, 0.5, 0.5, 0.5, 0.01]], np.float32))
    p = np.array([[0.7, 0.6, 0.3, 0.7, 0.2, 0.3]], np.float32)
    adv = np.array([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]], np.float32)
    logp, mask = np.log(p), np.ones_like(p)
    out = core.dppo_tv_loss(logp, old, adv, mask, threshold=0.15)
    # |p - p_old| = .2 (up, A>0: masked), .1 (kept), .2 (down, A<0: masked), .2 (up, A<0: back towards
    # pi_old, kept), .3 (down, A>0: kept), .29 (up, A<0: kept; rho = 30 truncated at C = 20)
    np.testing.assert_array_equal(out.clipped, [[1, 0, 1, 0, 0, 0]])
    weight = np.array([0, 1.2, 0, 1.4, 0.4, 20.0])
    np.testing.assert_allclose(out.loss, [-weight * adv[0] * logp[0]], rtol=1e-5)
    np.testing.assert_allclose(grad_logp(core.dppo_tv_loss, logp, old, adv, mask), [-weight * adv[0]], rtol=1e-5)


def test_dppo_kl_hand_values():
    old = np.log(np.full((1, 3), 0.5, np.float32))
    p = np.array([[0.7, 0.55, 0.7]], np.float32)
    adv = np.array([[1.0, 1.0, -1.0]], np.float32)
    # KL(Bern(.5) || Bern(.7)) = .5 ln(.5/.7) + .5 ln(.5/.3) = 0.0872 > .05; Bern(.55): 0.0050
    np.testing.assert_allclose(core.binary_kl(p, np.exp(old)), [[0.0872, 0.0050, 0.0872]], atol=1e-4)
    out = core.dppo_kl_loss(np.log(p), old, adv, np.ones_like(p), threshold=0.05)
    np.testing.assert_array_equal(out.clipped, [[1, 0, 0]])  # the third moves back towards pi_old
    np.testing.assert_allclose(grad_logp(core.dppo_kl_loss, np.log(p), old, adv, np.ones_like(p)),
                               [[0.0, -1.1, 1.4]], rtol=1e-5)


def dppo_numpy(logp, old, adv, mask, *, form, threshold, cap=20.0):
    """(loss, d loss / d log pi) in float64: -min(rho, C) A log pi on the tokens kept by the trust
    region; the weight and the mask are constants, so the gradient is -min(rho, C) A there."""
    p, q = np.exp(logp), np.exp(old)
    if form == "tv":
        divergence = np.abs(p - q)
    else:
        divergence = q * np.log(q / p) + (1 - q) * np.log((1 - q) / (1 - p))
    leaving = np.where(adv > 0, p > q, p < q)
    keep = (mask > 0) & ~(leaving & (divergence > threshold))
    weight = np.where(keep, np.minimum(np.exp(logp - old), cap), 0.0)
    return -weight * adv * logp, -weight * adv


@pytest.mark.parametrize("form", ["tv", "kl"])
def test_dppo_equals_the_numpy_formulation(form):
    rng = np.random.default_rng(3)
    old = np.log(rng.uniform(0.02, 0.98, (8, 9))).astype(np.float32)
    logp = np.log(np.clip(np.exp(old) + rng.normal(0, 0.2, old.shape), 0.01, 0.99)).astype(np.float32)
    adv = rng.normal(size=old.shape).astype(np.float32)
    mask = (rng.random(old.shape) < 0.85).astype(np.float32)
    fn, threshold = (core.dppo_tv_loss, 0.15) if form == "tv" else (core.dppo_kl_loss, 0.05)
    value, grad = dppo_numpy(logp.astype(np.float64), old.astype(np.float64), adv, mask, form=form,
                             threshold=threshold)
    out = fn(logp, old, adv, mask, threshold=threshold)
    assert 0.1 < float(np.asarray(out.clipped).sum() / mask.sum()) < 0.9  # both branches are exercised
    np.testing.assert_allclose(out.loss, value, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad_logp(fn, logp, old, adv, mask, threshold=threshold), grad, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------ Clip-Cov, KL-Cov


def test_top_covariance_tokens_hand_values():
    # mean A = 0, mean log pi = -2: c = [1*1, 1*-1, -1*1, -1*-1] = [1, -1, -1, 1]
    adv = np.array([[1.0, 1.0, -1.0, -1.0, 5.0]], np.float32)
    old = np.array([[-1.0, -3.0, -1.0, -3.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 1, 1, 0]], np.float32)
    np.testing.assert_allclose(core.covariance_scores(adv, old, mask), [[1, -1, -1, 1, 0]])
    pick = functools.partial(core.top_covariance_tokens, adv, old, mask)
    np.testing.assert_array_equal(pick(fraction=0.5), [[1, 0, 0, 1, 0]])
    np.testing.assert_array_equal(pick(fraction=0.25), [[1, 0, 0, 0, 0]])  # a tie goes to the earlier token
    np.testing.assert_array_equal(pick(fraction=0.1), [[1, 0, 0, 0, 0]])  # at least one token
    np.testing.assert_array_equal(pick(fraction=0.5, lower=0.5, upper=0.9), np.zeros((1, 5)))  # empty band
    np.testing.assert_array_equal(pick(fraction=1.0, lower=-1.5, upper=0.0), [[0, 1, 1, 0, 0]])


def test_top_covariance_tokens_equal_a_numpy_sort():
    data = random_batch(5, num_prompts=4, group_size=4, width=8, binary_rewards=False)
    adv = np.repeat(data.rewards.reshape(-1, 1), 8, axis=1) + np.random.default_rng(5).normal(0, 0.1, data.mask.shape)
    got = np.asarray(core.top_covariance_tokens(adv, data.old_logp, data.mask, fraction=0.1, lower=-0.5))
    valid = data.mask > 0
    a, lp = adv[valid].astype(np.float64), data.old_logp[valid].astype(np.float64)
    cov = (a - a.mean()) * (lp - lp.mean())
    count = max(1, math.floor(0.1 * valid.sum()))
    keep = np.flatnonzero(cov > -0.5)
    chosen = keep[np.argsort(-cov[keep])[:count]]
    want = np.zeros(valid.sum())
    want[chosen] = 1
    expected = np.zeros(data.mask.shape)
    expected[valid] = want
    np.testing.assert_array_equal(got, expected)
    assert got.sum() == count


def test_clip_cov_and_kl_cov_hand_values():
    old = np.log(np.full((1, 3), 0.5, np.float32))
    logp = np.log(np.array([[0.6, 0.7, 0.55]], np.float32))  # rho = 1.2, 1.4, 1.1
    adv, mask = np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)
    selected = np.array([[1.0, 0.0, 0.0]], np.float32)
    out = core.clip_cov_loss(logp, old, adv, mask, selected=selected)
    # selected: 0; rho 1.4 clipped at 1.2 (no gradient); rho 1.1 inside the clip range
    np.testing.assert_allclose(out.loss, [[0.0, -1.2, -1.1]], rtol=1e-5)
    np.testing.assert_array_equal(out.clipped, [[1, 1, 0]])
    np.testing.assert_allclose(grad_logp(core.clip_cov_loss, logp, old, adv, mask, selected=selected),
                               [[0.0, 0.0, -1.1]], rtol=1e-5)
    out = core.kl_cov_loss(logp, old, adv, mask, selected=selected, kl_coef=1.0)
    # selected: -1.2 + |ln 1.2|, gradient -1.2 + 1; the others unclipped: -rho, gradient -rho
    np.testing.assert_allclose(out.loss, [[-1.2 + math.log(1.2), -1.4, -1.1]], rtol=1e-5)
    np.testing.assert_allclose(grad_logp(core.kl_cov_loss, logp, old, adv, mask, selected=selected),
                               [[-0.2, -1.4, -1.1]], rtol=1e-4)
    # on policy (rho = 1) the penalty's gradient is 0, as |x|'s subgradient at 0 in the paper's code
    np.testing.assert_allclose(grad_logp(core.kl_cov_loss, old, old, adv, mask, selected=selected), -adv)


def ppo_numpy(logp, old, adv, eps):
    ratio = np.exp(logp - old)
    clipped = np.clip(ratio, 1 - eps, 1 + eps)
    return np.maximum(-adv * ratio, -adv * clipped)


def clip_cov_numpy(logp, old, adv, mask, selected, eps=0.2):
    return np.where((mask > 0) & (selected == 0), ppo_numpy(logp, old, adv, eps), 0.0)


def kl_cov_numpy(logp, old, adv, mask, selected, coef=1.0):
    return np.where(mask > 0, -np.exp(logp - old) * adv + coef * selected * np.abs(logp - old), 0.0)


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_losses_equal_the_numpy_formulation(name):
    data = random_batch(7, binary_rewards=False)
    adv = np.repeat(data.rewards.reshape(-1, 1), 8, axis=1).astype(np.float32)
    selected = np.asarray(core.top_covariance_tokens(adv, data.old_logp, data.mask, fraction=0.2))
    fn = core.clip_cov_loss if name == "clip_cov" else core.kl_cov_loss
    numpy_fn = clip_cov_numpy if name == "clip_cov" else kl_cov_numpy
    out = fn(data.logp, data.old_logp, adv, data.mask, selected=selected)
    f64 = lambda x: numpy_fn(x, data.old_logp.astype(np.float64), adv.astype(np.float64), data.mask,  # noqa: E731
                             selected)
    np.testing.assert_allclose(out.loss, f64(data.logp.astype(np.float64)), rtol=1e-5, atol=1e-6)
    eps = 1e-4  # central differences (no random point sits within eps of a clip or |.| kink)
    x = data.logp.astype(np.float64)
    fd = (f64(x + eps) - f64(x - eps)) / (2 * eps)
    np.testing.assert_allclose(grad_logp(fn, data.logp, data.old_logp, adv, data.mask, selected=selected), fd,
                               rtol=1e-3, atol=1e-5)
    assert np.all(np.asarray(out.clipped)[selected > 0] == 1)
    if name == "clip_cov":  # the selected tokens carry no gradient
        assert np.all(grad_logp(fn, data.logp, data.old_logp, adv, data.mask, selected=selected)[selected > 0] == 0)


def test_covariance_losses_refuse_a_missing_selection():
    data = random_batch(1)
    with pytest.raises(ValueError, match="needs `selected`"):
        core.clip_cov_loss(data.logp, data.old_logp, data.logp, data.mask)
    with pytest.raises(ValueError, match="token_selection"):
        core.get_recipe("clip_cov", token_selection=None)
    with pytest.raises(ValueError, match="token_selection"):
        core.get_recipe("grpo", token_selection=core.RECIPES["kl_cov"].token_selection)


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_selection_is_global_so_the_gradient_is_the_same_for_every_micro_batch_split(name):
    rec = core.get_recipe(name, token_selection=functools.partial(core.top_covariance_tokens, fraction=0.1))
    data = random_batch(11, num_prompts=4, group_size=4, width=8)
    batch, metrics = core.prepare_step_batch(rec, core.StepInputs(data.rewards, data.mask, data.old_logp,
                                                                  data.sampler_logp))
    assert float(metrics["selected_token_fraction"]) > 0

    grad = jax.jit(jax.grad(lambda lp, part: core.recipe_loss(rec, lp, part)[0]))

    def split_grad(k):
        rows = len(data.logp) // k
        return np.concatenate([np.asarray(grad(data.logp[i * rows:(i + 1) * rows], part))
                               for i, part in enumerate(core.micro_batches(batch, k))])

    whole = split_grad(1)
    for k in (2, 4, 16):
        np.testing.assert_allclose(split_grad(k), whole, rtol=0, atol=1e-7, err_msg=f"{k} micro-batches")
    # what the test guards against: picked within each micro-batch, the tokens differ
    per_part = np.concatenate([np.asarray(core.top_covariance_tokens(p.advantages, p.old_logp, p.mask, fraction=0.1))
                               for p in core.micro_batches(batch, 4)])
    assert not np.array_equal(per_part, np.asarray(batch.selected))


# -------------------------------------------------------------------------------------------- GPG


def test_gpg_hand_values():
    # B = 8 responses, M = 4 in the all-equal group: alpha = 8 / 4 = 2
    got = core.gpg_advantages(np.array([[1, 0, 0, 0], [1, 1, 1, 1]], np.float32))
    np.testing.assert_allclose(got, [[1.5, -0.5, -0.5, -0.5], [0, 0, 0, 0]], atol=1e-6)
    np.testing.assert_array_equal(core.gpg_advantages(np.ones((2, 3), np.float32)), np.zeros((2, 3)))


def test_gpg_recipe_gradient_equals_the_numpy_formulation():
    data = random_batch(9, num_prompts=6, group_size=4, width=8)
    rewards = data.rewards
    informative = rewards.std(axis=1) > 0
    alpha = rewards.size / (informative.sum() * rewards.shape[1])
    adv = alpha * (rewards - rewards.mean(axis=1, keepdims=True)) * informative[:, None]
    np.testing.assert_allclose(core.gpg_advantages(rewards), adv, rtol=1e-5, atol=1e-6)
    rec = core.get_recipe("gpg")
    batch, _ = core.prepare_step_batch(rec, core.StepInputs(rewards, data.mask, data.old_logp))
    grad = jax.grad(lambda lp: core.recipe_loss(rec, lp, batch)[0])(data.logp)
    # token mean of -A_i log pi_it: d/d log pi_it = -A_i / (number of valid tokens)
    want = -np.repeat(adv.reshape(-1, 1), 8, axis=1) * data.mask / data.mask.sum()
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------ config fields


def test_config_fields_reach_the_losses():
    plan = lambda *o: plan_run(apply_overrides(Config(), list(o))).recipe  # noqa: E731
    assert plan("recipe.name=dppo_tv", "recipe.dppo_threshold=0.1").policy_loss_fn.keywords == {"threshold": 0.1}
    sapo = plan("recipe.loss=sapo", "recipe.sapo_tau_pos=2.0", "recipe.sapo_tau_neg=3.0").policy_loss_fn
    logp, old = np.array([[-0.5, -0.5]], np.float32), np.array([[-1.0, -1.0]], np.float32)
    adv, mask = np.array([[1.0, -1.0]], np.float32), np.ones((1, 2), np.float32)
    rho = math.exp(0.5)  # -4/tau sigmoid(tau (rho - 1)) A with tau = 2 for A > 0, 3 for A < 0
    want = [-4 / 2 / (1 + math.exp(-2 * (rho - 1))), 4 / 3 / (1 + math.exp(-3 * (rho - 1)))]
    np.testing.assert_allclose(sapo(logp, old, adv, mask).loss, [want], rtol=1e-5)
    clip_cov = plan("recipe.name=clip_cov", "recipe.cov_fraction=0.01", "recipe.clip_cov_lower=0.5",
                    "recipe.clip_cov_upper=2.0")
    assert clip_cov.token_selection.keywords == {"fraction": 0.01, "lower": 0.5, "upper": 2.0}
    kl_cov = plan("recipe.name=kl_cov", "recipe.kl_cov_coef=0.5")
    assert kl_cov.policy_loss_fn.keywords == {"kl_coef": 0.5}
    assert plan("recipe.loss=kl_cov").token_selection.keywords == {"fraction": 2e-4}  # the loss brings its own
    assert plan("recipe.name=clip_cov", "recipe.loss=ppo_clip").token_selection is None


@pytest.mark.parametrize("overrides, message", [
    (["recipe.sapo_tau_pos=2.0"], "recipe.sapo_tau_pos = 2.0 is set, but the run's policy loss 'ppo_clip' has no "
                                  r"'tau_pos'; valid: recipe.loss in \['sapo'\]"),
    (["recipe.name=dppo_kl", "recipe.eps_high=0.3"], "recipe.eps_high = 0.3 is set, but the run's policy loss "
                                                     "'dppo_kl' has no 'eps_high'"),
    (["recipe.name=gpg", "recipe.dppo_threshold=0.1"], "recipe.dppo_threshold = 0.1 is set, but the run's policy "
                                                       "loss 'pg'"),
    (["recipe.cov_fraction=0.1"], r"recipe.cov_fraction = 0.1 .* valid: recipe.loss in \['clip_cov', 'kl_cov'\]"),
    (["recipe.name=clip_cov", "recipe.kl_cov_coef=1.0"], "recipe.kl_cov_coef = 1.0 is set, but the run's policy "
                                                         "loss 'clip_cov' has no 'kl_coef'"),
    (["recipe.cov_fraction=2.0", "recipe.name=kl_cov"], "recipe.cov_fraction"),
    (["recipe.dppo_threshold=0"], "recipe.dppo_threshold"),
])
def test_config_refuses_a_field_the_loss_does_not_take(overrides, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(Config(), overrides)
