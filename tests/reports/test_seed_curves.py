"""seed_band: the mean over seeds and its Student-t band per step, clipped to a known range."""
import numpy as np
import pytest

from jaxrl_llm.reports.seed_curves import seed_band


def test_seed_band_is_the_t_interval_clipped_to_the_limits():
    values = np.array([[0.9, 0.2], [1.0, 0.4], [1.0, 0.6]])  # [seeds, steps]
    # by hand: t(0.975, 2 dof) = 4.3027; step 1 mean 0.96667, sd 0.057735 -> half 0.14343;
    # step 2 mean 0.4, sd 0.2 -> half 0.49683
    mean, low, high = seed_band(values)
    assert mean == pytest.approx([0.966667, 0.4], abs=1e-6)
    assert low == pytest.approx([0.823237, -0.096828], abs=1e-5)
    assert high == pytest.approx([1.110096, 0.896828], abs=1e-5)
    mean_c, low_c, high_c = seed_band(values, (0.0, 1.0))
    assert mean_c == pytest.approx(mean)  # the mean is never clipped
    assert low_c == pytest.approx([0.823237, 0.0], abs=1e-5) and high_c == pytest.approx([1.0, 0.896828], abs=1e-5)


def test_length_bands_stay_between_zero_and_the_token_cap():
    from jaxrl_llm.reports.seed_curves import reward_length_limits
    limits = reward_length_limits(32)
    assert limits["reward"] == (0.0, 1.0)
    lengths = np.array([[2.0, 31.0], [4.0, 32.0], [30.0, 20.0]])  # the t-band would pass 0 and 32
    _, low, high = seed_band(lengths, limits["length_incorrect"])
    assert low.min() == 0.0 and high.max() == 32.0
