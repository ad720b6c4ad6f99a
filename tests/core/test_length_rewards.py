"""L1 (LCPO) and Kimi k1.5 length rewards against values worked out by hand."""
import numpy as np
import pytest

from jaxrl_llm import core


def test_l1_reward_hand_values():
    # alpha = 0.01, target 100: |100 - 80| = 20 -> -0.2, |100 - 130| = 30 -> -0.3, exact -> 0
    out = core.l1_length_reward(np.array([80, 130, 100]), np.array([100, 100, 100]), alpha=0.01)
    np.testing.assert_allclose(out, [-0.2, -0.3, 0.0], rtol=1e-6, atol=1e-7)
    per_prompt = core.l1_length_reward(np.array([[10, 20]]), np.array([[15], ]), alpha=1.0)  # broadcast target
    np.testing.assert_allclose(per_prompt, [[-5.0, -5.0]])
    with pytest.raises(ValueError, match="alpha"):
        core.l1_length_reward(np.array([1]), np.array([1]), alpha=-1.0)


def test_kimi_reward_hand_values():
    # group lengths 10, 20, 30, 50: min 10, max 50, lambda = 0.5 - (len - 10) / 40 = 0.5, 0.25, 0.0, -0.5
    lengths = np.array([[10, 20, 30, 50], [10, 20, 30, 50], [7, 7, 7, 7]])
    correct = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]], bool)
    out = core.kimi_length_reward(lengths, correct)
    np.testing.assert_allclose(out[0], [0.5, 0.25, 0.0, -0.5], atol=1e-7)  # correct: lambda
    np.testing.assert_allclose(out[1], [0.0, 0.0, 0.0, -0.5], atol=1e-7)  # incorrect: min(0, lambda)
    np.testing.assert_array_equal(out[2], [0.0, 0.0, 0.0, 0.0])  # one length: no signal
    mixed = core.kimi_length_reward(np.array([[10, 50]]), np.array([[0, 1]]))
    np.testing.assert_allclose(mixed, [[0.0, -0.5]])  # a short wrong answer is not rewarded


def test_diversity_from_class_labels_hand_values():
    # classes {0, 2}, {1}, {3, 4, 5}: div = (6 - size) / 5
    np.testing.assert_allclose(core.diversity_from_classes([7, 3, 7, 1, 1, 1]), [0.8, 1.0, 0.8, 0.6, 0.6, 0.6],
                               rtol=1e-6)
    np.testing.assert_array_equal(core.diversity_from_classes([0]), [1.0])
