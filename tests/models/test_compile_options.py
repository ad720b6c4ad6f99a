"""The learner's XLA:CPU option: when it applies, that XLA:CPU really fuses differently
with it, and that the values stay those of the default build."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.models import DecoderConfig, init_params, token_logprobs
from jaxrl_llm.models.compile_options import FLOAT32_CPU_OPTIONS, YNN_FUSION, learner_compiler_options
from jaxrl_llm.train.learn.batch import SequenceBatch
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner

TINY = DecoderConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                     num_kv_heads=2, head_dim=16)


def test_option_only_for_float32_on_cpu_unless_the_user_says_otherwise():
    def options(dtype="float32", backend="cpu", environ=None, jaxlib=(0, 10)):
        return learner_compiler_options(dtype, backend, environ=environ or {}, jaxlib_minor=jaxlib)

    assert options() == {YNN_FUSION: "LIBRARY_FUSION_TYPE_DOT"}
    assert options(np.dtype("float32")) == options()
    assert options("bfloat16") is None and options("float16") is None
    assert options(backend="gpu") is None and options(backend="tpu") is None
    assert options(jaxlib=(0, 11)) is None  # a version it was not measured on may not know the option
    assert options(environ={"JAXRL_LLM_XLA_CPU_OPTIONS": "0"}) is None
    assert options(environ={"XLA_FLAGS": f"--{YNN_FUSION}=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}) is None
    assert options(environ={"XLA_FLAGS": "--xla_cpu_use_onednn=true"}) == options()


def _step(options):
    params = init_params(TINY, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, TINY.vocab_size)
    step = jax.jit(jax.value_and_grad(lambda p, t: -jnp.mean(token_logprobs(p, TINY, t))), compiler_options=options)
    compiled = step.lower(params, tokens).compile()
    return compiled.as_text(), step(params, tokens)


def test_option_changes_the_fusions_not_the_values():
    default_text, (default_loss, default_grads) = _step(None)
    fused_text, (loss, grads) = _step(dict(FLOAT32_CPU_OPTIONS))
    assert fused_text != default_text  # XLA:CPU took the option (an unknown one would raise)
    assert fused_text.count("__ynn_fusion") != default_text.count("__ynn_fusion")
    np.testing.assert_allclose(float(loss), float(default_loss), rtol=1e-6)
    for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(default_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)


def test_float32_learner_compiles_its_step_with_the_option():
    train_cfg = dataclasses.replace(TrainConfig(), precision="fp32")
    learner = Learner(TINY, core.get_recipe("grpo"), train_cfg, total_steps=2)
    seq = SequenceBatch(np.ones((2, 8), np.int32), np.ones((2, 8), np.int32), np.tile(np.arange(8, dtype=np.int32), (2, 1)),
                        np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32), np.zeros(2, bool), 4)
    rows = learner.place.rows(learner.plan(seq))
    args = (learner.init(init_params(TINY, jax.random.PRNGKey(0))).params, None, None, None, None, rows)
    text = learner._logprobs.lower(*args, with_reference=False, max_segments=1).compile().as_text()
    plain = jax.jit(learner._logprobs_impl, static_argnames=("with_reference", "max_segments"))
    plain_text = plain.lower(*args, with_reference=False, max_segments=1).compile().as_text()
    expected = learner_compiler_options("float32", jax.default_backend())
    assert (text != plain_text) == (expected is not None)
