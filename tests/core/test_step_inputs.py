"""core.StepInputs: one pytree for a step's data; core.mini_batch slices it by prompt or by row."""
import jax
import numpy as np
import pytest

from jaxrl_llm import core


def _inputs():
    rewards = np.arange(6, dtype=np.float32).reshape(3, 2)  # P = 3, G = 2
    mask = np.ones((6, 4), np.float32)
    logp = -np.arange(24, dtype=np.float32).reshape(6, 4) / 10
    return core.StepInputs(rewards, mask, logp, sampler_logp=logp - 1, truncated=np.arange(6) % 2 == 0,
                           extras={"per_prompt": np.array([10.0, 20.0, 30.0]),
                                   "per_row": np.arange(12, dtype=np.float32).reshape(6, 2)})


def test_mini_batch_takes_prompt_rows_of_p_arrays_and_response_rows_of_n_arrays():
    inputs = _inputs()
    middle = core.mini_batch(inputs, 1, 3)  # prompt 1, rows 2 and 3
    np.testing.assert_array_equal(middle.rewards, [[2.0, 3.0]])
    np.testing.assert_array_equal(middle.old_logp, inputs.old_logp[2:4])
    np.testing.assert_array_equal(middle.sampler_logp, inputs.old_logp[2:4] - 1)
    np.testing.assert_array_equal(middle.truncated, [True, False])
    np.testing.assert_array_equal(middle.extras["per_prompt"], [20.0])
    np.testing.assert_array_equal(middle.extras["per_row"], [[4, 5], [6, 7]])
    assert middle.ref_logp is None and middle.correct is None
    whole = core.mini_batch(inputs, 0, 1)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(inputs)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="cannot split 3 prompts into 2"):
        core.mini_batch(inputs, 0, 2)


def test_step_inputs_is_one_pytree_under_jit_and_prepare_refuses_anything_else():
    recipe = core.get_recipe("grpo")
    inputs = _inputs()._replace(extras={})
    eager, _ = core.prepare_step_batch(recipe, inputs)
    jitted, _ = jax.jit(lambda x: core.prepare_step_batch(recipe, x))(inputs)
    np.testing.assert_allclose(np.asarray(jitted.advantages), np.asarray(eager.advantages), rtol=1e-6)
    # GRPO by hand: every group is (r, r + 1), so A = -/+ 0.5 / (std_ddof1 = 0.7071 + 1e-6)
    np.testing.assert_allclose(np.asarray(eager.advantages)[:, 0], np.tile([-1, 1], 3) * 0.5 / (0.5 ** 0.5 + 1e-6),
                               rtol=1e-5)
    with pytest.raises(TypeError, match="takes a core.StepInputs, got ndarray"):
        core.prepare_step_batch(recipe, inputs.rewards)
    with pytest.raises(ValueError, match="StepInputs without old_logp"):
        core.prepare_step_batch(recipe, inputs._replace(old_logp=None))
    assert core.estimator_inputs(recipe) == ()
    assert core.estimator_inputs(core.get_recipe("remax")) == ("baseline_rewards",)
