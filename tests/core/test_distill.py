"""On-policy distillation math (core/distill.py, the opd recipe): hand values, and an
independent numpy formulation on random inputs, values and gradients."""
import jax
import numpy as np
import pytest

from jaxrl_llm import core
from tests.core.batches import poison_padding, random_batch


def test_reverse_kl_advantage_hand_values():
    # teacher probs 0.5, 0.25; student 0.25, 0.25, padding last
    teacher = np.log(np.array([[0.5, 0.25, 0.9]], np.float32))
    student = np.log(np.array([[0.25, 0.25, 0.1]], np.float32))
    mask = np.array([[1, 1, 0]], np.float32)
    adv = np.asarray(core.reverse_kl_advantages(teacher, student, mask))
    np.testing.assert_allclose(adv, [[np.log(2.0), 0.0, 0.0]], rtol=1e-6)
    # reverse KL per token = mean of log S - log T over the 2 valid tokens = -log(2) / 2
    np.testing.assert_allclose(float(core.reverse_kl_mean(teacher, student, mask)), -np.log(2.0) / 2, rtol=1e-6)
    # mixing: w * A_reward + signal, 0 outside the mask
    mixed = core.distill_advantages(np.array([[2.0, -1.0, 7.0]], np.float32), teacher, student, mask,
                                    reward_weight=0.5)
    np.testing.assert_allclose(np.asarray(mixed), [[np.log(2.0) + 1.0, -0.5, 0.0]], rtol=1e-6)


def test_teacher_equal_to_student_gives_exactly_zero_signal():
    b = random_batch(0)
    adv = np.asarray(core.reverse_kl_advantages(b.old_logp, b.old_logp.copy(), b.mask))
    assert np.array_equal(adv, np.zeros_like(adv))


def test_padding_is_harmless_and_reward_weight_is_checked():
    b = random_batch(1)
    teacher = poison_padding(b.sampler_logp, b.mask)
    adv = np.asarray(core.distill_advantages(np.zeros_like(b.mask), teacher, b.old_logp, b.mask, reward_weight=0.0))
    assert np.all(np.isfinite(adv)) and np.all(adv[b.mask == 0] == 0)
    with pytest.raises(ValueError, match="reward_weight must be a finite number >= 0, got -1"):
        core.Distillation(reward_weight=-1.0)


def _numpy_opd(rewards, mask, old_logp, teacher_logp, w):
    """The opd recipe on-policy, written out in numpy: A = w * GRPO(rewards) + (T - S), token mean."""
    p, g = rewards.shape
    std = rewards.std(axis=1, ddof=1, keepdims=True)
    grpo = ((rewards - rewards.mean(axis=1, keepdims=True)) / (std + 1e-6)).reshape(-1, 1)
    adv = np.where(mask > 0, w * grpo + (teacher_logp - old_logp), 0.0)
    weights = mask / max(mask.sum(), 1.0)
    # on-policy PPO-clip: ratio 1, d loss / d logp = -A * w_it
    return adv, -adv * weights


@pytest.mark.parametrize("seed,w", [(2, 0.0), (3, 0.7)])
def test_opd_step_matches_numpy_values_and_gradients(seed, w):
    b = random_batch(seed, binary_rewards=False)
    teacher = b.sampler_logp  # any other log-probs
    recipe = core.get_recipe("opd", distill=core.Distillation(reward_weight=w))
    batch, metrics = core.prepare_step_batch(recipe, core.StepInputs(b.rewards, b.mask, b.old_logp,
                                                                     teacher_logp=teacher))
    want_adv, want_grad = _numpy_opd(b.rewards.astype(np.float64), b.mask, b.old_logp.astype(np.float64),
                                     teacher.astype(np.float64), w)
    np.testing.assert_allclose(np.asarray(batch.advantages), want_adv, rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda lp: core.recipe_loss(recipe, lp, batch)[0])(b.old_logp)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-7)
    valid = b.mask > 0
    want_kl = np.sum((b.old_logp - teacher)[valid]) / valid.sum()
    np.testing.assert_allclose(float(metrics["teacher_reverse_kl"]), want_kl, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["teacher_signal_abs_max"]), np.abs(b.old_logp - teacher)[valid].max(),
                               rtol=1e-6)


def test_teacher_logp_is_required_exactly_with_a_distilling_recipe():
    b = random_batch(4)
    with pytest.raises(ValueError, match="recipe 'opd' has distill=.*teacher_logp must be given"):
        core.prepare_step_batch(core.get_recipe("opd"), core.StepInputs(b.rewards, b.mask, b.old_logp))
    with pytest.raises(ValueError, match="recipe 'grpo' has distill=None; teacher_logp must be given"):
        core.prepare_step_batch(core.get_recipe("grpo"), core.StepInputs(b.rewards, b.mask, b.old_logp,
                                                                         teacher_logp=b.old_logp))
