"""bench/stats.py, the one statistics module of the benchmarks and the docs' tables, against hand-worked numbers."""

from __future__ import annotations

import math

import pytest

from bench import stats


def test_mean_std_and_se():
    # [1, 2, 3, 4]: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, variance 5 / 3
    mean, std = stats.mean_std([1, 2, 3, 4])
    assert mean == 2.5 and std == pytest.approx(math.sqrt(5 / 3), abs=1e-12)
    assert stats.mean_se([1, 2, 3, 4]) == pytest.approx((2.5, math.sqrt(5 / 3) / 2), abs=1e-12)
    assert stats.mean_se([2.0, None, 4.0]) == pytest.approx((3.0, 1.0), abs=1e-12)  # None left out: sd sqrt(2)
    assert stats.mean_se([7.0]) == (7.0, 0.0)
    assert all(math.isnan(x) for x in stats.mean_se([]))


def test_differences_paired_and_independent():
    a, b = [3.0, 5.0, 4.0], [1.0, 2.0, 4.0]
    assert stats.differences(a, b) == [2.0, 3.0, 0.0]
    # differences 2, 3, 0: mean 5/3, variance ((1/3)^2 + (4/3)^2 + (5/3)^2) / 2 = 7/3
    assert stats.paired(a, b) == pytest.approx((5 / 3, math.sqrt(7 / 3) / math.sqrt(3)), abs=1e-12)
    # independent: se_a = 1 / sqrt(3) (sd 1), se_b = sqrt(7/3) / sqrt(3)
    assert stats.diff_se(a, b) == pytest.approx((5 / 3, math.sqrt(1 / 3 + 7 / 9)), abs=1e-12)
    with pytest.raises(ValueError):
        stats.paired([1.0, 2.0], [1.0])


def test_t_test_and_sign_count():
    # t = 3 / (sqrt(2.5) / sqrt(5)) = 4.243 with 4 degrees of freedom: p = 0.0132 (Student's t table)
    assert stats.t_test_p([1, 2, 3, 4, 5]) == pytest.approx(0.01324, abs=1e-4)
    assert stats.t_test_p([0.33, 0.16, 0.46]) == pytest.approx(0.0677, abs=1e-3)  # t(2) = 3.78
    assert stats.t_test_p([1.0, -1.0]) == pytest.approx(1.0, abs=1e-6)  # mean 0
    assert stats.t_test_p([1.0]) is None and stats.t_test_p([2.0, 2.0]) is None
    assert stats.wins([0.5, -0.1, 0.0, 2.0]) == 2


def test_pm():
    assert stats.pm((1.234, 0.051)) == "1.23 ± 0.05"
    assert stats.pm((0.5, 0.01), 3, sign="+") == "+0.500 ± 0.010"
