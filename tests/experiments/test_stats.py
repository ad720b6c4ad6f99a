"""The across-seed interval utility (reports/stats.py) against numbers derived by hand."""
import math

import numpy as np
import pytest

from jaxrl_llm.reports import stats


def test_t_interval_by_hand():
    """values 1, 2, 3, 4: mean 2.5, s = sqrt(5/3) = 1.290994, t_{0.975, 3} = 3.182446,
    half width 3.182446 * 1.290994 / 2 = 2.054260."""
    iv = stats.interval([1, 2, 3, 4])
    assert iv.n == 4 and iv.mean == pytest.approx(2.5)
    assert iv.low == pytest.approx(2.5 - 2.054260, abs=1e-5) and iv.high == pytest.approx(2.5 + 2.054260, abs=1e-5)
    assert iv.excludes_zero() and not stats.interval([-1, 1, 2]).excludes_zero()  # low 0.446 > 0


def test_log_interval_by_hand():
    """Ratios 1, 2, 4: geometric mean 2; the logs 0, ln 2, 2 ln 2 have sd ln 2, so the bounds are
    2 exp(-+ t_{0.975, 2} ln 2 / sqrt 3) with t_{0.975, 2} = 4.302653: 0.35746 and 11.190."""
    mean, low, high, n = stats.log_interval([1.0, 2.0, 4.0])
    half = 4.302653 * math.log(2) / math.sqrt(3)
    assert n == 3 and mean == pytest.approx(2.0)
    assert (low, high) == pytest.approx((2 * math.exp(-half), 2 * math.exp(half)), rel=1e-6)
    assert (low, high) == pytest.approx((0.35746, 11.190), rel=1e-4)
    # symmetric in a ratio and its inverse: 1/4, 1/2, 1 -> 1/2 [1/11.190, 1/0.35746]
    inv = stats.log_interval([0.25, 0.5, 1.0])
    assert (inv.mean, inv.low, inv.high) == pytest.approx((0.5, 1 / high, 1 / low))
    assert math.isnan(stats.log_interval([3.0]).low)
    with pytest.raises(ValueError, match=r"positive ratios; got \[-1.0\]"):
        stats.log_interval([2.0, -1.0])


def test_t_interval_covers_the_true_mean_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = [stats.interval(rng.normal(1.0, 2.0, 5)) for _ in range(4000)]
    coverage = np.mean([iv.low <= 1.0 <= iv.high for iv in hits])
    assert coverage == pytest.approx(0.95, abs=0.012)


def test_bootstrap_agrees_with_t_on_many_normal_values_and_nan_is_dropped():
    x = np.random.default_rng(1).normal(0.0, 1.0, 400)
    t, b = stats.interval(x), stats.bootstrap_interval(x)
    assert b.mean == t.mean and b.low == pytest.approx(t.low, abs=0.02) and b.high == pytest.approx(t.high, abs=0.02)
    assert stats.interval([1.0, float("nan"), 3.0]).n == 2


def test_one_seed_has_no_interval_and_says_so():
    iv = stats.interval([0.5])
    assert iv.n == 1 and math.isnan(iv.low) and "1 seed, no interval" in stats.format_interval(iv)
    assert stats.format_interval(stats.interval([1, 2, 3]), signed=True).startswith("+2 [")
    assert "--quick uses 2 of the full size's 5 seeds" in stats.seed_note([0, 1], quick=True, full_seeds=5)
    with pytest.raises(ValueError, match="level=1.5"):
        stats.interval([1, 2], level=1.5)


def test_parse_seeds():
    assert stats.parse_seeds("0,1,2", (9,)) == (0, 1, 2) and stats.parse_seeds(None, (9,)) == (9,)
    for bad in ("a", "1,1", ""):
        with pytest.raises(ValueError, match="valid: distinct integers"):
            stats.parse_seeds(bad, (0,))


def test_t_test_power_matches_a_simulation_and_the_normal_approximation():
    """Power of the paired t-test, by Monte Carlo: draw n seeds' differences from N(effect, sd),
    count how often the 95% t-interval excludes 0. And the textbook normal approximation
    n ~ ((z_0.975 + z_0.8) sd / effect)^2 = (2.80 x 4.22 / 3)^2 = 15.5, which the t-test needs
    ~2 more seeds than (df correction)."""
    rng = np.random.default_rng(1)
    for n, effect, sd in ((6, 3.0, 4.22), (18, 3.0, 4.22), (8, 1.0, 1.0)):
        draws = rng.normal(effect, sd, size=(6000, n))
        simulated = np.mean([stats.interval(row).excludes_zero() for row in draws])
        assert stats.t_test_power(n, effect, sd) == pytest.approx(simulated, abs=0.02), (n, effect, sd)
    normal = ((1.959964 + 0.841621) * 4.22 / 3.0) ** 2
    n = stats.seeds_for_power(3.0, 4.22)
    assert normal + 1 <= n <= normal + 3
    assert stats.t_test_power(n, 3.0, 4.22) >= 0.8 > stats.t_test_power(n - 1, 3.0, 4.22)
    assert stats.seeds_for_power(-3.0, 4.22) == n  # two-sided: the sign does not matter
    with pytest.raises(ValueError, match="valid: n >= 2 seeds and sd > 0"):
        stats.t_test_power(1, 3.0, 4.22)
