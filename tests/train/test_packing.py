"""Packing in the learner (train/learn/packing.py): the plan against hand-built layouts, packed ==
one-sequence-per-row loss, gradients and metrics for every aggregation mode and on an 8-device
mesh, segment isolation, and the padding metric against a hand count."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.core.aggregation import AGGREGATION_MODES
from jaxrl_llm.models import DecoderConfig, init_params, make_mesh, token_logprobs
from jaxrl_llm.train.learn.batch import SequenceBatch
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner
from jaxrl_llm.train.learn.packing import first_fit_decreasing, plan_rows

PROMPT_WIDTH, COMPLETION_WIDTH = 6, 10
CFG = DecoderConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, tie_word_embeddings=False, max_position_embeddings=64)


def sequence_batch(prompt_lengths, completion_lengths, seed=0) -> SequenceBatch:
    """Rows laid out as build_sequences does: [left pad | prompt | completion | right pad]."""
    rng = np.random.default_rng(seed)
    n, width = len(prompt_lengths), PROMPT_WIDTH + COMPLETION_WIDTH
    tokens = np.zeros((n, width), np.int32)
    attention = np.zeros((n, width), np.int32)
    completion = np.zeros((n, COMPLETION_WIDTH), np.float32)
    for i, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
        tokens[i, PROMPT_WIDTH - p:PROMPT_WIDTH + c] = rng.integers(1, CFG.vocab_size, p + c)
        attention[i, PROMPT_WIDTH - p:PROMPT_WIDTH + c] = 1
        completion[i, :c] = 1
    positions = np.maximum(np.cumsum(attention, 1) - 1, 0).astype(np.int32)
    sampler = -np.abs(rng.normal(1.0, 0.5, completion.shape)).astype(np.float32) * completion
    return SequenceBatch(tokens, attention, positions, completion, sampler, np.zeros(n, bool), PROMPT_WIDTH)


# 4 prompts x 4 samples, lengths 2..16 tokens: several fit in one 16-slot row
PROMPTS = [2, 2, 2, 2, 5, 5, 5, 5, 1, 1, 1, 1, 3, 3, 3, 3]
COMPLETIONS = [10, 3, 1, 7, 2, 9, 4, 4, 6, 1, 10, 2, 5, 8, 3, 1]


def test_first_fit_decreasing_by_hand():
    # lengths 9, 7, 5, 4, 3 into rows of 12: 9 -> row 0 (3 left); 7 -> row 1 (5 left); 5 -> row 1 (0 left);
    # 4 -> row 2 (8 left); 3 -> row 0 (0 left)
    rows = first_fit_decreasing(np.array([5, 9, 3, 7, 4]), np.zeros(5), 12, 12, pack=True)
    assert rows == [[1, 2], [3, 0], [4]]
    # the completion cap binds: a row takes at most 4 completion tokens, so 9 and 3 cannot share
    rows = first_fit_decreasing(np.array([5, 9, 3, 7, 4]), np.array([1, 3, 2, 1, 1]), 12, 4, pack=True)
    assert rows == [[1], [3, 0], [4, 2]]
    assert first_fit_decreasing(np.array([5, 9]), np.zeros(2), 12, 12, pack=False) == [[0], [1]]


def test_plan_places_every_token_once():
    seq = sequence_batch(PROMPTS, COMPLETIONS)
    plan = plan_rows(seq.tokens, seq.attention_mask, PROMPT_WIDTH, rows_per_micro=2, pack=True)
    k, rows, width = plan.tokens.shape
    assert (k, rows) == (8, 2)  # ceil(16 sequences / 2 rows): the one-per-row bound, whatever the lengths
    lengths = np.array(PROMPTS) + np.array(COMPLETIONS)
    assert (plan.segment_ids > 0).sum() == lengths.sum()
    # every row's tokens are its sequences' tokens, back to back from slot 0, positions restarting
    for m in range(k):
        for r in range(rows):
            seg = plan.segment_ids[m, r]
            real = seg > 0
            assert np.all(real[:real.sum()])  # no gap before the row's padding
            for s in set(seg[real]):
                where = np.flatnonzero(seg == s)
                np.testing.assert_array_equal(plan.positions[m, r, where], np.arange(where.size))
    # each completion token read back where it was: the slot the head reads predicts it
    for i, c in enumerate(COMPLETIONS):
        m = plan.micro_batch[i]
        flat_tokens = plan.tokens[m].reshape(-1)
        slots = plan.head_slots[m][plan.completion_index[i, :c]]
        np.testing.assert_array_equal(flat_tokens[slots + 1], seq.tokens[i, PROMPT_WIDTH:PROMPT_WIDTH + c])
    assert plan.used.sum() < k  # packing left micro-batches empty
    slots = plan.used.sum() * rows * width
    assert plan.padding_fraction == pytest.approx(1 - lengths.sum() / slots)


def make_learner(recipe, mesh=None, **train):
    train_cfg = dataclasses.replace(TrainConfig(), **{"precision": "fp32", "lr": 1e-3, **train})
    return Learner(CFG, recipe, train_cfg, total_steps=4, temperature=0.8, mesh=mesh)


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, jax.random.key(3), dtype="float32")


def loss_grads_metrics(recipe, params, seq, rewards, mesh=None, **train):
    learner = make_learner(recipe, mesh, **train)
    state = learner.init(params)
    old_logp, _ = make_learner(recipe, pack=False, micro_batch_size=16).logprobs(state.params, seq)
    shift = np.random.default_rng(7).normal(0.0, 0.2, seq.completion_mask.shape) * seq.completion_mask
    batch, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(rewards), jnp.asarray(seq.completion_mask),
                                                               old_logp + shift, jnp.asarray(seq.sampler_logp)))
    return learner.loss_and_grads(state.params, seq, batch)


def assert_same(a, b, rtol=1e-5):
    (loss_a, grads_a, metrics_a), (loss_b, grads_b, metrics_b) = a, b
    np.testing.assert_allclose(float(loss_a), float(loss_b), rtol=rtol, atol=1e-8)
    assert set(metrics_a) == set(metrics_b)
    for key in metrics_a:
        np.testing.assert_allclose(float(metrics_a[key]), float(metrics_b[key]), rtol=rtol, atol=1e-7, err_msg=key)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads_b))
    for ga, gb in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        assert float(jnp.max(jnp.abs(ga - gb))) <= rtol * scale


@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
def test_packed_equals_unpacked_for_every_aggregation(params, aggregation):
    recipe = dataclasses.replace(core.get_recipe("grpo"), aggregation=aggregation,
                                 constant_length=COMPLETION_WIDTH if aggregation == "constant" else None)
    seq = sequence_batch(PROMPTS, COMPLETIONS)
    rewards = np.random.default_rng(1).integers(0, 2, (4, 4)).astype(np.float32)
    unpacked = loss_grads_metrics(recipe, params, seq, rewards, pack=False, micro_batch_size=4)
    packed = loss_grads_metrics(recipe, params, seq, rewards, pack=True, micro_batch_tokens=3 * 16)
    assert make_learner(recipe, pack=True, micro_batch_tokens=48).plan(seq).used.sum() < 4  # fewer passes
    assert_same(packed, unpacked)


def test_packed_equals_unpacked_with_sequence_level_loss_on_a_mesh(params):
    """GSPO's ratio is a per-sequence mean: whole sequences per micro-batch keep it exact; on an
    8-device mesh (data 4 x fsdp 2) the rows of a micro-batch are spread over the devices."""
    recipe = core.get_recipe("gspo")
    seq = sequence_batch(PROMPTS, COMPLETIONS, seed=4)
    rewards = np.random.default_rng(2).normal(size=(4, 4)).astype(np.float32)
    unpacked = loss_grads_metrics(recipe, params, seq, rewards, pack=False, micro_batch_size=16)
    mesh = make_mesh(data=4, fsdp=2, tensor=1)
    packed = loss_grads_metrics(recipe, params, seq, rewards, mesh=mesh, pack=True, micro_batch_tokens=2 * 16)
    assert make_learner(recipe, mesh, pack=True, micro_batch_tokens=32).plan(seq).tokens.shape[1] == 8  # 2 -> 8 rows
    assert_same(packed, unpacked)


def test_a_token_never_sees_the_sequence_packed_beside_it(params):
    """A sequence packed after another one: its log-probs equal those computed alone, and do not
    move when the tokens before it in the row (the other sequence) change."""
    second = np.array([5, 8, 13, 2, 40, 7], np.int32)
    alone = token_logprobs(params, CFG, jnp.asarray(second[None]))[0]
    outs = []
    for seed in (0, 1):
        before = np.random.default_rng(seed).integers(1, CFG.vocab_size, 9).astype(np.int32)
        row = np.concatenate([before, second])[None]
        segments = np.array([[1] * before.size + [2] * second.size])
        outs.append(np.asarray(token_logprobs(params, CFG, jnp.asarray(row), segment_ids=jnp.asarray(segments))))
    mine = slice(before.size, before.size + second.size - 1)
    np.testing.assert_allclose(outs[0][0, mine], np.asarray(alone), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(outs[0][0, mine], outs[1][0, mine])
    assert not np.allclose(outs[0][0, :before.size - 1], outs[1][0, :before.size - 1])  # the others did differ


def test_update_reports_the_padding_it_computed(params):
    recipe = core.get_recipe("grpo")
    seq = sequence_batch(PROMPTS, COMPLETIONS)
    rewards = np.random.default_rng(1).integers(0, 2, (4, 4)).astype(np.float32)
    tokens = sum(PROMPTS) + sum(COMPLETIONS)
    for pack, expected_slots in ((False, 16 * 16), (True, None)):
        learner = make_learner(recipe, pack=pack, micro_batch_size=4)
        state = learner.init(params)
        old_logp, _ = learner.logprobs(state.params, seq)
        batch, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(rewards),
                                                                   jnp.asarray(seq.completion_mask), old_logp))
        _, metrics = learner.update(state, seq, batch)
        plan = learner.plan(seq)
        slots = expected_slots or int(plan.used.sum()) * 4 * 16
        assert float(metrics["learner_padding_fraction"]) == pytest.approx(1 - tokens / slots)
    assert slots < 16 * 16
