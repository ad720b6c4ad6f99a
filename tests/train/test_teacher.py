"""The distillation teacher in the learner's pi_old pass against independent computations: a
teacher of another architecture (Qwen3 with q/k norm, untied head) scoring a Llama student's
samples equals one full-logits forward of the teacher's params; its memory is counted by hand;
with LoRA it is the only extra copy, and the student's own base as teacher gives exactly 0."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner
from jaxrl_llm.train.run.teacher import Teacher
from tests.models.hf_reference import hf_model, our_config_and_params
from tests.train.reference_setup import TEMPERATURE, sampled_setup, separate_forward_logprobs


@pytest.fixture(scope="module")
def setup():
    return sampled_setup()


def opd_learner(cfg, teacher, **train):
    train_cfg = dataclasses.replace(TrainConfig(), **{"precision": "fp32", "micro_batch_size": 4, **train})
    return Learner(cfg, core.get_recipe("opd"), train_cfg, total_steps=2, temperature=TEMPERATURE, teacher=teacher)


def test_a_teacher_of_another_architecture_equals_its_own_full_forward(setup):
    cfg, params, seq, _ = setup
    teacher_cfg, teacher_params = our_config_and_params(hf_model("qwen3_qk_norm", seed=11))
    assert teacher_cfg.vocab_size == cfg.vocab_size and teacher_cfg != cfg
    learner = opd_learner(cfg, Teacher(teacher_cfg, teacher_params, "qwen3", None))
    state = learner.init(params)
    out = learner.step_logprobs(state.params, seq)
    mask = seq.completion_mask > 0
    expected = separate_forward_logprobs(teacher_params, teacher_cfg, seq, jnp.float32)
    np.testing.assert_allclose(np.asarray(out.teacher_logp)[mask], expected[mask], atol=0, rtol=2e-6)
    student = separate_forward_logprobs(params, cfg, seq, jnp.float32)
    assert np.max(np.abs(student - expected)[mask]) > 0.1  # a different model: the signal is not 0
    assert out.ref_logp is None and learner.reference is None  # no KL term: no reference copy
    assert learner.teacher_bytes == 4 * sum(x.size for x in jax.tree.leaves(teacher_params))


def test_with_lora_the_teacher_is_the_only_extra_copy_and_the_base_as_teacher_gives_zero(setup):
    cfg, params, seq, _ = setup
    learner = opd_learner(cfg, Teacher(cfg, params, "base", None), lora_rank=4, precision="bf16")
    state = learner.init(params)
    assert learner.reference is None and learner.reference_bytes == 0
    assert learner.teacher_bytes == 2 * sum(x.size for x in jax.tree.leaves(params))  # bf16
    out = learner.step_logprobs(state.params, seq)  # adapters start at B = 0: the student is the base
    signal = np.asarray(core.reverse_kl_advantages(out.teacher_logp, out.logp, seq.completion_mask))
    assert np.array_equal(signal, np.zeros_like(signal)) and np.sum(seq.completion_mask) > 0
