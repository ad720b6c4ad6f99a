"""Bitwise on-policy runs (issue 37): with rollout.batch_invariant every step logs
mismatch_tokens_differing 0 and mismatch_k3 exactly 0.0 (the weights move between steps, so each
step checks freshly synced weights); without it both are non-zero; and reusing the sampler's
log-probs as pi_old (train.reuse_sampler_logprobs) trains the same weights bit for bit."""
import jax
import numpy as np
import pytest

from jaxrl_llm.train.run import loop

from jaxrl_llm.train.sample import stage as sampling
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.policy import load_policy
from jaxrl_llm.train.sample.prompts import task_from_config
from tests.train.tiny_run import raises_or_hangs, tiny_config

STEPS = 10


def _run(model_dir, run_dir, monkeypatch, *extra, steps=STEPS):
    cfg = tiny_config(model_dir, run_dir, f"total_steps={steps}", "checkpoint.every_steps=100", "rollout.max_tokens=8",
                      "rollout.temperature=0.7", *extra)
    policy = load_policy(cfg.model.source)
    task = task_from_config(cfg)
    monkeypatch.setattr(type(task), "reward_fn", staticmethod(raises_or_hangs))
    # a random tiny model never answers right: grade alternate samples right so the weights move
    monkeypatch.setattr(sampling, "decode_completions", lambda policy, rollouts: ["right", "wrong"] * (len(rollouts) // 2))
    out = loop.train(cfg, policy=policy, task=task)
    return read_metrics(cfg.run_path), out.state.params


@pytest.mark.slow  # three 10-step runs of the tiny model: a few minutes on 2 cores
def test_ten_steps_log_zero_mismatch_only_with_batch_invariance(tiny_model_dir, tmp_path, monkeypatch):
    on, params_on = _run(tiny_model_dir, tmp_path / "on", monkeypatch, "rollout.batch_invariant=true")
    off, _ = _run(tiny_model_dir, tmp_path / "off", monkeypatch)
    reused, params_reused = _run(tiny_model_dir, tmp_path / "reuse", monkeypatch, "rollout.batch_invariant=true",
                                 "train.reuse_sampler_logprobs=true")
    assert len(on) == len(off) == STEPS
    assert [r["mismatch_tokens_differing"] for r in on] == [0.0] * STEPS
    assert [r["mismatch_k3"] for r in on] == [0.0] * STEPS
    assert all(r["mismatch_tokens_differing"] > 0 and r["mismatch_k3"] != 0.0 for r in off), \
        [(r["mismatch_tokens_differing"], r["mismatch_k3"]) for r in off]
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params_on), jax.tree.leaves(params_reused)))
    assert [r["loss"] for r in on] == [r["loss"] for r in reused]


@pytest.fixture(scope="module")
def tiny_moe_model_dir(tmp_path_factory) -> str:
    """The tiny decoder as a random Qwen3-MoE (4 experts of width 32, top-2) with SmolLM2's tokenizer."""
    from jaxrl_llm import bridge
    from jaxrl_llm.models import init_params
    from jaxrl_llm.models.config import tiny_decoder_config

    cfg = tiny_decoder_config(family="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                              norm_topk_prob=True, tie_word_embeddings=False)
    out = tmp_path_factory.mktemp("tiny_moe") / "model"
    bridge.save_hf_dir(cfg, init_params(cfg, jax.random.key(0)), out, tokenizer_dir=bridge.smollm2_hf_dir())
    return str(out)


@pytest.mark.slow  # one 4-step run of the tiny MoE model
def test_moe_run_logs_zero_mismatch_with_batch_invariance(tiny_moe_model_dir, tmp_path, monkeypatch):
    """Issue 49: a mixture-of-experts policy sampled by the JAX engine with batch_invariant (and its routed
    experts recorded): every step's sampler log-probs equal the learner's pi_old bit for bit."""
    records, _ = _run(tiny_moe_model_dir, tmp_path / "moe", monkeypatch, "rollout.batch_invariant=true",
                      "rollout.return_routed_experts=true", steps=4)
    assert [r["mismatch_tokens_differing"] for r in records] == [0.0] * 4
    assert [r["mismatch_k3"] for r in records] == [0.0] * 4
