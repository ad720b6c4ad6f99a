"""Issue 48's off-policy corrections and metrics (core/off_policy.py, corrections.mismatch_metrics):
NeMo-RL's seq-mask-tis, AReaL's decoupled PPO weight, every mask's masked fraction and the
per-token ESS, against hand values and against numpy loops written apart from the code."""
import functools
import math

import jax
import numpy as np
import pytest

from jaxrl_llm import core


def _logps(log_ratios, mask):
    """(old_logp, sampler_logp) with log pi_old - log mu = log_ratios, NaN on padding."""
    log_ratios = np.asarray(log_ratios, np.float64)
    old = np.full(log_ratios.shape, -1.0)
    mu = old - log_ratios
    pad = np.asarray(mask) == 0
    return np.where(pad, np.nan, old).astype(np.float32), np.where(pad, np.nan, mu).astype(np.float32)


# seq-mask-tis: row 0 g = 1 (kept), row 1 g = e^0.01 > 1.002 (out), row 2 g = e^-0.0008 (kept),
# row 3 g = e^-0.0015 < 0.999 (out)
SMT_MASK = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], np.float32)
SMT_LR = np.array([[0.001, -0.001, 0.0], [0.01, 0.01, 0.0], [-0.0024, 0.0, 0.0], [-0.0015, -0.0015, -0.0015]])


def _seq_mask_tis_loop(log_ratios, mask, low, high):
    """NeMo-RL's rule, one row at a time: (weights, keep)."""
    weights, keep = np.zeros(mask.shape), np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        tokens = [t for t in range(mask.shape[1]) if mask[i, t]]
        geo = math.exp(sum(log_ratios[i, t] for t in tokens) / max(len(tokens), 1))
        if low <= geo <= high:
            for t in tokens:
                keep[i, t], weights[i, t] = 1.0, math.exp(log_ratios[i, t])
    return weights, keep


def test_seq_mask_tis_hand_values():
    out = jax.jit(core.seq_mask_tis)(*_logps(SMT_LR, SMT_MASK), SMT_MASK)
    e = math.exp
    np.testing.assert_allclose(out.weights, [[e(0.001), e(-0.001), 1], [0, 0, 0], [e(-0.0024), 1, 1], [0, 0, 0]],
                               rtol=1e-5)
    np.testing.assert_array_equal(out.keep, [[1, 1, 1], [0, 0, 0], [1, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(out.masked, [[0, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(out.clipped, 0)


def test_seq_mask_tis_matches_a_loop_on_random_batches():
    rng = np.random.default_rng(0)
    for _ in range(5):
        mask = (rng.random((6, 7)) < 0.8).astype(np.float32)
        log_ratios = rng.normal(0.0, 0.002, mask.shape)
        out = core.seq_mask_tis(*_logps(log_ratios, mask), mask, low=0.9995, high=1.001)
        weights, keep = _seq_mask_tis_loop(log_ratios, mask, 0.9995, 1.001)
        np.testing.assert_allclose(out.weights, weights, rtol=1e-4)
        np.testing.assert_array_equal(out.keep, keep)


def test_decoupled_ppo_weight_hand_values():
    mask = np.array([[1, 1, 1, 0]], np.float32)
    out = core.decoupled_ppo(*_logps(np.log([[6.0, 2.0, 0.1, 1.0]]), mask), mask, cap=5.0)
    np.testing.assert_allclose(out.weights, [[0.0, 2.0, 0.1, 0.0]], rtol=1e-5)
    np.testing.assert_array_equal(out.keep, [[1, 1, 1, 0]])  # over the cap: weight 0, still in the denominator
    np.testing.assert_array_equal(out.masked, [[1, 0, 0, 0]])


def _areal_loss(logp, prox, behav, rewards, mask, eps=0.2, cap=5.0):
    """AReaL's ppo_actor_loss_fn (token mask at `cap`, no lower bound), loop by loop, with GRPO's
    advantage (ddof 1, eps 1e-6) and the token mean over the mask from BEFORE rejection."""
    group = rewards.shape[1]
    total, count = 0.0, 0
    for i in range(mask.shape[0]):
        r = rewards[i // group]
        adv = (r[i % group] - r.mean()) / (r.std(ddof=1) + 1e-6)
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            count += 1
            ratio = math.exp(logp[i, t] - prox[i, t])
            behave = math.exp(prox[i, t] - behav[i, t])
            pg = max(-adv * ratio, -adv * min(max(ratio, 1 - eps), 1 + eps))
            total += (behave if behave <= cap else 0.0) * pg
    return total / count


def test_decoupled_ppo_on_ppo_clip_is_arreals_loss():
    rng = np.random.default_rng(3)
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]], np.float32)
    mask = (rng.random((8, 6)) < 0.85).astype(np.float32)
    prox = np.log(rng.uniform(0.05, 0.95, mask.shape)).astype(np.float32)
    behav = (prox - rng.normal(0.0, 1.2, mask.shape)).astype(np.float32)  # ratios up to ~e^3: some over 5
    logp = (prox + rng.normal(0.0, 0.3, mask.shape)).astype(np.float32)
    assert np.sum(mask * (prox - behav > np.log(5.0))) >= 3  # the cap binds on several tokens
    recipe = core.customize_recipe(core.get_recipe("grpo"), aggregation="token_mean", correction="decoupled_ppo")
    batch, metrics = core.prepare_step_batch(recipe, core.StepInputs(rewards, mask, prox, behav))
    loss, _ = core.recipe_loss(recipe, logp, batch)
    assert float(loss) == pytest.approx(_areal_loss(logp, prox, behav, rewards, mask), rel=1e-4)
    over = np.sum(mask * (prox - behav > np.log(5.0))) / np.sum(mask)
    assert float(metrics["correction_masked_fraction"]) == pytest.approx(over, rel=1e-5)
    assert float(metrics["mask_fraction_decoupled_cap"]) == pytest.approx(over, rel=1e-5)


# mask_fractions: row 0 ratios (6, 1), row 1 (0.4, 30), row 2 (1, 1), row 3 (e^0.0015, e^0.0015)
MF_LR = np.log([[6.0, 1.0], [0.4, 30.0], [1.0, 1.0], [math.exp(0.0015), math.exp(0.0015)]])
MF_MASK = np.ones((4, 2), np.float32)


def test_mask_fractions_hand_values():
    fractions = jax.jit(core.mask_fractions)(*_logps(MF_LR, MF_MASK), MF_MASK)
    expected = {"token_mis": 3 / 8,  # 6, 0.4, 30 outside [0.5, 5]
                "sequence_mis": 2 / 8,  # rho_1 = 12 > 10
                "geometric": 6 / 8,  # g = sqrt 6, sqrt 12, e^0.0015 outside [0.999, 1.001]
                "seq_mask_tis": 4 / 8,  # e^0.0015 inside [0.999, 1.002]
                "decoupled_cap": 2 / 8}  # 6 and 30 over 5
    for name, value in expected.items():
        assert float(fractions[f"mask_fraction_{name}"]) == pytest.approx(value), name


def _mask_fractions_loop(log_ratios, mask, b=core.off_policy.MASK_BOUNDS):
    counts = dict.fromkeys(b, 0)
    for i in range(mask.shape[0]):
        tokens = [t for t in range(mask.shape[1]) if mask[i, t]]
        total = sum(log_ratios[i, t] for t in tokens)
        geo = math.exp(total / max(len(tokens), 1))
        for t in tokens:
            ratio = math.exp(log_ratios[i, t])
            counts["token_mis"] += not b["token_mis"][0] <= ratio <= b["token_mis"][1]
            counts["sequence_mis"] += math.exp(total) > b["sequence_mis"]
            counts["geometric"] += not b["geometric"][0] <= geo <= b["geometric"][1]
            counts["seq_mask_tis"] += not b["seq_mask_tis"][0] <= geo <= b["seq_mask_tis"][1]
            counts["decoupled_cap"] += ratio > b["decoupled_cap"]
    return {f"mask_fraction_{k}": v / max(mask.sum(), 1) for k, v in counts.items()}


def test_mask_fractions_match_a_loop_on_random_batches():
    rng = np.random.default_rng(2)
    for scale in (0.0005, 0.5, 1.5):
        mask = (rng.random((6, 5)) < 0.8).astype(np.float32)
        log_ratios = rng.normal(0.0, scale, mask.shape)
        got = core.mask_fractions(*_logps(log_ratios, mask), mask)
        for name, value in _mask_fractions_loop(log_ratios, mask).items():
            assert float(got[name]) == pytest.approx(value, abs=1e-6), (scale, name)


def test_token_ess_hand_value_and_formula():
    mask = np.array([[1, 1], [1, 0]], np.float32)
    metrics = core.mismatch_metrics(*_logps(np.log([[1.0, 2.0], [2.0, 1.0]]), mask), mask)
    assert float(metrics["mismatch_token_ess"]) == pytest.approx(25 / 27)  # w = 1, 2, 2: 5^2 / (3 * 9)
    rng = np.random.default_rng(3)
    mask = (rng.random((5, 6)) < 0.7).astype(np.float32)
    log_ratios = rng.normal(0.0, 0.7, mask.shape)
    w = np.exp(log_ratios[mask > 0])
    got = core.mismatch_metrics(*_logps(log_ratios, mask), mask)["mismatch_token_ess"]
    assert float(got) == pytest.approx(w.sum() ** 2 / (w.size * np.sum(w ** 2)), rel=1e-5)


def test_new_corrections_are_named_in_the_registry():
    assert core.CORRECTIONS["seq_mask_tis"] is core.seq_mask_tis
    assert core.CORRECTIONS["decoupled_ppo"] is core.decoupled_ppo
    recipe = core.customize_recipe(core.get_recipe("grpo"), correction="seq_mask_tis",
                                   correction_params={"low": 0.99, "high": 1.01})
    assert recipe.correction.func is core.seq_mask_tis and recipe.correction.keywords == {"low": 0.99, "high": 1.01}
    with pytest.raises(ValueError, match="low <= high"):
        functools.partial(core.seq_mask_tis, low=1.01, high=0.99)(*_logps(SMT_LR, SMT_MASK), SMT_MASK)
