"""DARLING equivalence classes and diversity rewards."""
import numpy as np
import pytest

from jaxrl_llm import core


def close(a, b):
    return abs(a - b) <= 1


def test_equivalence_classes_close_transitively():
    # 1~2 and 2~3 put 1 and 3 together although close(1, 3) is False.
    assert core.equivalence_classes([1, 2, 3, 10, 11, 20], close) == [0, 0, 0, 1, 1, 2]
    assert core.equivalence_classes([20, 3, 11, 1, 2, 10], close) == [0, 1, 2, 1, 1, 2]
    assert core.equivalence_classes([], close) == []


def test_darling_rewards_hand_values():
    responses = [1, 2, 3, 10, 11, 20]  # class sizes 3, 3, 3, 2, 2, 1 in a group of 6
    rewards = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    diversity = np.array([3, 3, 3, 4, 4, 5]) / 5  # responses outside own class / (G - 1)
    np.testing.assert_allclose(core.diversity_scores(responses, close), diversity, rtol=1e-6)
    np.testing.assert_allclose(core.darling_rewards(rewards, responses, close), rewards * diversity, rtol=1e-6)
    batch = core.darling_rewards_batch(np.stack([rewards, rewards]), [responses, responses[::-1]], close)
    np.testing.assert_allclose(batch[1], rewards * diversity[::-1], rtol=1e-6)


def test_single_response_and_all_same():
    np.testing.assert_array_equal(core.darling_rewards([0.7], ["x"], close), np.float32([0.7]))
    np.testing.assert_array_equal(core.darling_rewards([1.0, 1.0], [5, 5], close), [0.0, 0.0])


def test_predicates():
    assert core.same_normalised_text("The answer is 42.", "the  answer is 42")
    assert not core.same_normalised_text("42", "43")
    same = core.ngram_overlap_predicate(n=2, threshold=0.5)
    # bigrams {a b, b c, c d} vs {a b, b c, c e}: Jaccard 2/4
    assert same("a b c d", "a b c e")
    assert not same("a b c d", "x y z w")
    assert same("hi", "Hi!")  # shorter than n: one n-gram of all words


def test_bad_inputs():
    with pytest.raises(ValueError, match="3 responses"):
        core.darling_rewards([1.0, 0.0], ["a", "b", "c"], close)
    with pytest.raises(ValueError, match="threshold"):
        core.ngram_overlap_predicate(n=2, threshold=0.0)
