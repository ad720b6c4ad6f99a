"""Property tests (hypothesis) of the invariances on random batches.

Shapes are fixed per property so each jitted function compiles once; the
examples vary lengths, values, modes and split points.
"""
import functools
import math
from fractions import Fraction

import jax
import numpy as np
from hypothesis import given, settings, strategies as st

from jaxrl_llm import core
from tests.core.batches import lengths_to_mask

N, T = 8, 6
CONSTANT_LENGTH = 7.0
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)

modes = st.sampled_from(core.AGGREGATION_MODES)
lengths = st.lists(st.integers(0, T), min_size=N, max_size=N)
seeds = st.integers(0, 2 ** 31 - 1)


def _arrays(seed, row_lengths):
    rng = np.random.default_rng(seed)
    mask = lengths_to_mask(row_lengths, T)
    old = np.log(rng.uniform(0.05, 1.0, (N, T))).astype(np.float32)
    logp = (old + rng.normal(0, 0.3, (N, T))).astype(np.float32)
    adv = (rng.normal(size=(N, 1)) * mask).astype(np.float32)
    return logp, old, adv, mask


@functools.cache
def _value_and_grad(mode):
    def objective(logp, old, adv, mask, weights):
        out = core.ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
        return core.aggregate(out.loss, weights)
    return jax.jit(jax.value_and_grad(objective))


def _numpy_weights(row_lengths, mode):
    """Independent numpy statement of the weight table in docs/objectives.md#aggregation-modes."""
    row_lengths = np.asarray(row_lengths, np.float64)
    n = max(np.sum(row_lengths > 0), 1)
    per_row = {
        "seq_mean_token_mean": 1.0 / (n * np.maximum(row_lengths, 1)),
        "token_mean": np.full(N, 1.0 / max(row_lengths.sum(), 1)),
        "seq_mean_token_sum": np.full(N, 1.0 / n),
        "constant": np.full(N, 1.0 / (n * CONSTANT_LENGTH)),
    }[mode]
    return per_row[:, None] * lengths_to_mask(row_lengths, T)


@SETTINGS
@given(seed=seeds, row_lengths=lengths, mode=modes)
def test_pg_gradient_is_minus_weight_times_advantage(seed, row_lengths, mode):
    logp, _, adv, mask = _arrays(seed, row_lengths)
    weights = core.token_weights(mask, mode, constant_length=CONSTANT_LENGTH)
    np.testing.assert_allclose(weights, _numpy_weights(row_lengths, mode), rtol=1e-6)
    grad = jax.grad(lambda lp: core.aggregate(core.pg_loss(lp, lp, adv, mask).loss, weights))(logp)
    np.testing.assert_allclose(grad, -_numpy_weights(row_lengths, mode) * adv, rtol=1e-6, atol=1e-9)


@SETTINGS
@given(seed=seeds, row_lengths=lengths, mode=modes, parts=st.sampled_from([2, 4, 8]))
def test_micro_batch_sum_equals_one_pass(seed, row_lengths, mode, parts):
    logp, old, adv, mask = _arrays(seed, row_lengths)
    weights = core.token_weights(mask, mode, constant_length=CONSTANT_LENGTH)
    value, grad = _value_and_grad(mode)(logp, old, adv, mask, weights)
    pieces = [_value_and_grad(mode)(*(np.split(np.asarray(a), parts)[k] for a in (logp, old, adv, mask, weights)))
              for k in range(parts)]
    assert abs(sum(float(v) for v, _ in pieces) - float(value)) <= 1e-6
    assert np.max(np.abs(np.concatenate([g for _, g in pieces]) - grad)) <= 1e-6


@SETTINGS
@given(seed=seeds, row_lengths=lengths, mode=modes, poison=st.sampled_from([np.nan, np.inf, -np.inf]))
def test_padding_and_poisoned_positions_change_nothing(seed, row_lengths, mode, poison):
    logp, old, adv, mask = _arrays(seed, row_lengths)
    weights = core.token_weights(mask, mode, constant_length=CONSTANT_LENGTH)
    value, grad = _value_and_grad(mode)(logp, old, adv, mask, weights)

    def widen(x, fill):  # two extra padding columns, and poison in existing padding
        x = np.where(mask != 0, x, fill) if fill is not None else x
        return np.concatenate([x, np.full((N, 2), 0.0 if fill is None else fill, np.float32)], axis=1)

    wide_mask = widen(mask, None)
    wide_weights = core.token_weights(wide_mask, mode, constant_length=CONSTANT_LENGTH)
    wide_value, wide_grad = _value_and_grad(mode)(widen(logp, poison), widen(old, poison),
                                                  widen(adv, poison), wide_mask, wide_weights)
    np.testing.assert_allclose(float(wide_value), float(value), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(wide_grad)[:, :T], grad, rtol=1e-6, atol=1e-8)
    assert np.all(np.asarray(wide_grad)[wide_mask == 0] == 0.0)


@SETTINGS
@given(seed=seeds, row_lengths=lengths, mode=modes, row=st.integers(0, N - 1))
def test_masking_a_row_equals_dropping_it(seed, row_lengths, mode, row):
    mask = lengths_to_mask(row_lengths, T)
    masked = mask.copy()
    masked[row] = 0
    kept = np.delete(np.asarray(core.token_weights(masked, mode, constant_length=CONSTANT_LENGTH)), row, axis=0)
    dropped = core.token_weights(np.delete(mask, row, axis=0), mode, constant_length=CONSTANT_LENGTH)
    np.testing.assert_allclose(kept, dropped, rtol=1e-6)


rewards_st = st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0, 3.25]), min_size=4, max_size=4),
                      min_size=3, max_size=3)


@SETTINGS
@given(rewards=rewards_st, shift=st.floats(-10, 10), scale=st.floats(0.1, 10))
def test_group_advantages(rewards, shift, scale):
    rewards = np.asarray(rewards, np.float32)
    grpo = np.asarray(core.grpo_advantages(rewards, eps=0.0))
    assert np.all(np.isfinite(grpo))
    np.testing.assert_allclose(grpo.sum(axis=1), 0.0, atol=1e-5)
    shifted = core.grpo_advantages((rewards * scale + shift).astype(np.float32), eps=0.0)
    np.testing.assert_allclose(shifted, grpo, atol=1e-3)
    loo = [[r[i] - np.mean(np.delete(r, i)) for i in range(len(r))] for r in rewards.astype(np.float64)]
    np.testing.assert_allclose(core.rloo_advantages(rewards), loo, atol=1e-5)
    constant = np.all(rewards == rewards[:, :1], axis=1)
    assert np.all(grpo[constant] == 0.0)


@SETTINGS
@given(k=st.sampled_from([1, 4, 16]), data=st.data())
def test_pass_at_k_matches_binomials(k, data):
    n = data.draw(st.lists(st.integers(k, 300), min_size=4, max_size=4))
    c = [data.draw(st.integers(0, m)) for m in n]
    expected = [float(1 - Fraction(math.comb(m - j, k), math.comb(m, k))) for m, j in zip(n, c)]
    np.testing.assert_allclose(core.pass_at_k(np.array(n), np.array(c), k), expected, atol=2e-6)


@SETTINGS
@given(size=st.integers(1, 9), data=st.data())
def test_equivalence_classes_are_connected_components(size, data):
    edges = data.draw(st.sets(st.tuples(st.integers(0, size - 1), st.integers(0, size - 1)), max_size=12))
    linked = {(a, b) for a, b in edges} | {(b, a) for a, b in edges}
    labels = core.equivalence_classes(list(range(size)), lambda a, b: (a, b) in linked)
    # second formulation: breadth-first search from each unvisited node
    component = {}
    for start in range(size):
        if start in component:
            continue
        frontier = [start]
        component[start] = start
        while frontier:
            node = frontier.pop()
            for other in range(size):
                if other not in component and (node, other) in linked:
                    component[other] = start
                    frontier.append(other)
    for a in range(size):
        for b in range(size):
            assert (labels[a] == labels[b]) == (component[a] == component[b])
    assert labels[0] == 0 and max(labels) + 1 == len(set(component.values()))
