"""VinePPO's pure functions against hand-worked examples and the telescoping identity:
chunk advantages of a response sum to R - V(prompt)."""
import numpy as np
import pytest

from jaxrl_llm.core import vineppo

NL = 7  # a newline token id


def test_chunk_starts_every_k_and_after_newlines():
    tokens = np.array([[3, NL, 4, 5, NL, 6], [NL, 1, 2, 0, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], np.float32)
    every = np.asarray(vineppo.chunk_starts(tokens, mask, every=4))
    np.testing.assert_array_equal(every, [[1, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]])
    newline = np.asarray(vineppo.chunk_starts(tokens, mask, newline_ids=[NL]))
    np.testing.assert_array_equal(newline, [[1, 0, 1, 0, 0, 1], [1, 1, 0, 0, 0, 0]])
    both = np.asarray(vineppo.chunk_starts(tokens, mask, every=4, newline_ids=[NL]))
    np.testing.assert_array_equal(both, every | newline)
    with pytest.raises(ValueError, match="every=0; valid"):
        vineppo.chunk_starts(tokens, mask, every=0)


def test_chunk_advantages_by_hand():
    # starts at 0, 2, 3; V = 0.5, 0.25, 1.0; R = 0; length 5 of 6
    starts = np.array([[1, 0, 1, 1, 0, 0]], bool)
    values = np.array([[0.5, 9, 0.25, 1.0, 9, 9]], np.float32)  # 9: not a start, ignored
    mask = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
    got = np.asarray(vineppo.chunk_advantages(values, starts, np.array([0.0]), mask))
    np.testing.assert_allclose(got, [[-0.25, -0.25, 0.75, -1.0, -1.0, 0.0]])


def test_chunk_advantages_telescope_to_reward_minus_prompt_value():
    rng = np.random.default_rng(0)
    n, width = 64, 20
    lengths = rng.integers(1, width + 1, n)
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.float32)
    starts = (rng.random((n, width)) < 0.3) | (np.arange(width)[None] == 0)
    values = rng.random((n, width)).astype(np.float32)
    rewards = rng.integers(0, 2, n).astype(np.float32)
    adv = np.asarray(vineppo.chunk_advantages(values, starts, rewards, mask))
    valid_starts = starts & (mask > 0)
    per_chunk = (adv * valid_starts).sum(axis=1)  # one advantage per chunk
    np.testing.assert_allclose(per_chunk, rewards - values[:, 0], atol=1e-5)
    for i in range(n):  # every token carries its chunk's advantage
        chunk = np.cumsum(valid_starts[i]) - 1
        for t in range(lengths[i]):
            np.testing.assert_allclose(adv[i, t], adv[i, np.flatnonzero(valid_starts[i])[chunk[t]]])
    assert np.all(adv[mask == 0] == 0)


def test_mc_values_mean_and_standard_error():
    rewards = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], np.float32)
    mean, err = vineppo.mc_values(rewards)
    np.testing.assert_allclose(mean, [0.75, 0.0])
    np.testing.assert_allclose(err, [np.std([1, 0, 1, 1], ddof=1) / 2, 0.0], rtol=1e-6)


def test_prepare_step_batch_places_given_advantages_only_for_vineppo():
    from jaxrl_llm import core

    rewards = np.array([[1.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    adv = np.array([[0.5, -0.25, 9.0], [2.0, 9.0, 9.0]], np.float32)  # 9: padding, must not survive
    logp = np.zeros((2, 3), np.float32)
    batch, metrics = core.prepare_step_batch(core.get_recipe("vineppo"), core.StepInputs(rewards, mask, logp,
                                                                                         extras={"advantages": adv}))
    np.testing.assert_array_equal(np.asarray(batch.advantages), [[0.5, -0.25, 0.0], [2.0, 0.0, 0.0]])
    np.testing.assert_allclose(float(metrics["advantage_token_mean"]), (0.5 - 0.25 + 2.0) / 3)
    with pytest.raises(ValueError, match=r"extras \['advantages'\] given, but recipe .grpo.*does not declare them"):
        core.prepare_step_batch(core.get_recipe("grpo"), core.StepInputs(rewards, mask, logp,
                                                                         extras={"advantages": adv}))
    with pytest.raises(ValueError, match="VinePPO advantages come from extra rollouts"):
        core.prepare_step_batch(core.get_recipe("vineppo"), core.StepInputs(rewards, mask, logp))
