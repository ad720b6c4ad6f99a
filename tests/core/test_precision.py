"""bf16 / fp16 inputs are computed in float32 inside every core function."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from tests.core.batches import random_batch

LOW_PRECISION = (jnp.bfloat16, jnp.float16)
DATA = random_batch(21, num_prompts=2, group_size=4, width=6, binary_rewards=False)
ADV = np.asarray(core.broadcast_to_tokens(core.grpo_advantages(DATA.rewards), DATA.mask))
MASK = DATA.mask

# (name, function of float arrays, float arrays): outputs must be float32 and equal
# to the same function applied to the inputs first rounded to 16 bits, then upcast.
CASES = [
    ("grpo", core.grpo_advantages, (DATA.rewards,)),
    ("dr_grpo", core.dr_grpo_advantages, (DATA.rewards,)),
    ("rloo", core.rloo_advantages, (DATA.rewards,)),
    ("batch_std", core.batch_std_advantages, (DATA.rewards,)),
    ("reinforce_pp", lambda r: core.reinforce_pp_advantages(r, MASK), (DATA.rewards,)),
    ("broadcast", lambda a: core.broadcast_to_tokens(a, MASK), (DATA.rewards,)),
    ("gae", lambda r, v: core.gae_advantages(r, v, MASK, gamma=0.99, lam=0.9), (DATA.values, DATA.values)),
    ("aggregate", lambda l: core.aggregate(l, core.token_weights(MASK, "token_mean")), (DATA.logp,)),
    ("kl_k1", core.kl_k1, (DATA.logp, DATA.old_logp)),
    ("kl_k2", core.kl_k2, (DATA.logp, DATA.old_logp)),
    ("kl_k3", core.kl_k3, (DATA.logp, DATA.old_logp)),
    ("token_tis", lambda a, b: core.token_tis(a, b, MASK), (DATA.old_logp, DATA.sampler_logp)),
    ("token_mis", lambda a, b: core.token_mis(a, b, MASK), (DATA.old_logp, DATA.sampler_logp)),
    ("sequence_tis", lambda a, b: core.sequence_tis(a, b, MASK), (DATA.old_logp, DATA.sampler_logp)),
    ("sequence_mis", lambda a, b: core.sequence_mis(a, b, MASK), (DATA.old_logp, DATA.sampler_logp)),
    ("mismatch", lambda a, b: core.mismatch_metrics(a, b, MASK), (DATA.old_logp, DATA.sampler_logp)),
    ("value_loss", lambda v, o, r: core.clipped_value_loss(v, o, r, MASK), (DATA.values, DATA.logp, DATA.old_logp)),
    ("overlong", lambda l: core.overlong_penalty(l, max_length=8, buffer=4), (DATA.values * 4 + 6,)),
    ("difficulty", lambda p: core.difficulty_weight(p, std_normalised=True), (np.float32([0.1, 0.5]),)),
    ("avg_at_k", core.avg_at_k, (DATA.values,)),
] + [
    (f"loss_{name}", functools.partial(fn, sampler_logp=DATA.sampler_logp.astype(np.float16)),
     (DATA.logp, DATA.old_logp, ADV, MASK))
    for name, fn in {
        "pg": core.pg_loss,
        "ppo": functools.partial(core.ppo_clip_loss, dual_clip=3.0),
        "cispo": functools.partial(core.cispo_loss, eps_high=0.5),
        "gspo": functools.partial(core.gspo_loss, eps_low=0.1, eps_high=0.1),
        "gmpo": core.gmpo_loss,
        "is_pg": functools.partial(core.is_pg_sequence_loss, cap=2.0),
    }.items()
]


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name, fn, args", CASES, ids=[c[0] for c in CASES])
def test_low_precision_inputs_are_computed_in_float32(name, fn, args, dtype):
    low = [jnp.asarray(a, dtype) for a in args]
    upcast = [a.astype(jnp.float32) for a in low]
    out, reference = jax.tree.leaves(fn(*low)), jax.tree.leaves(fn(*upcast))
    for got, want in zip(out, reference):
        assert got.dtype == jnp.float32, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_float32_compute_is_what_makes_the_difference():
    """The same formulas evaluated in bf16 would be visibly wrong."""
    x = jnp.asarray([[2.0 ** -10]], jnp.bfloat16)  # log pi_ref - log pi, exact in bf16
    k3 = core.kl_k3(jnp.zeros_like(x), x)
    exact = 2.0 ** -21 + 2.0 ** -30 / 6  # x^2/2 + x^3/6
    assert abs(float(k3[0, 0]) - exact) <= 2 * np.finfo(np.float32).eps * 2.0 ** -10  # 2 ulps of x
    assert float((jnp.expm1(x) - x)[0, 0]) == 0.0  # in bf16 the whole KL rounds away

    logp = jnp.asarray(DATA.logp, jnp.bfloat16)
    old = jnp.asarray(DATA.old_logp, jnp.bfloat16)
    ours = core.ppo_clip_loss(logp, old, ADV, MASK, eps_low=10.0, eps_high=10.0).loss
    in_bf16 = (-jnp.asarray(ADV, jnp.bfloat16) * jnp.exp(logp - old)).astype(jnp.float32) * MASK
    assert float(jnp.max(jnp.abs(ours - in_bf16))) > 1e-3


def test_recipe_step_with_bf16_logprobs():
    rec = core.get_recipe("olmo3")
    bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
    batch, metrics = core.prepare_step_batch(rec, core.StepInputs(DATA.rewards, MASK, bf16(DATA.old_logp),
                                                                  bf16(DATA.sampler_logp)))
    loss, _ = core.recipe_loss(rec, bf16(DATA.logp), batch)
    reference_batch, _ = core.prepare_step_batch(rec, core.StepInputs(DATA.rewards, MASK,
                                                                      bf16(DATA.old_logp).astype(jnp.float32),
                                                                      bf16(DATA.sampler_logp).astype(jnp.float32)))
    reference, _ = core.recipe_loss(rec, bf16(DATA.logp).astype(jnp.float32), reference_batch)
    assert loss.dtype == jnp.float32 and all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(batch))
    assert float(loss) == float(reference)
