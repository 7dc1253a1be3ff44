"""Agreement statistics against hand-worked numbers."""

from __future__ import annotations

from collections import Counter

import pytest

from rlhfkit.labelling.agreement import cohen_kappa, fleiss_kappa, pair_agreement, wilson_interval


def test_cohen_kappa_by_hand():
    # p_o = 4/5; rater 1 gives x,y,tie 2,2,1 times, rater 2 1,3,1: p_e = (2*1 + 2*3 + 1*1) / 25 = 0.36
    first = ["x", "x", "y", "y", "tie"]
    second = ["x", "y", "y", "y", "tie"]
    assert cohen_kappa(first, second) == pytest.approx((0.8 - 0.36) / (1 - 0.36), abs=1e-12)
    assert cohen_kappa(first, first) == pytest.approx(1.0)
    assert cohen_kappa(["x", "y"], ["y", "x"]) == pytest.approx(-1.0)  # p_o 0, p_e 0.5
    assert cohen_kappa(["x", "x"], ["x", "x"]) is None  # one label only: undefined


def test_fleiss_kappa_by_hand_with_unequal_raters_per_item():
    items = [Counter(x=2), Counter(x=1, y=1), Counter(y=3), Counter(x=1, y=1, tie=1), Counter(x=1)]
    # P_i = 1, 0, 1, 0 (the last item has one rating and is left out): mean 0.5;
    # shares x 4/10, y 5/10, tie 1/10: P_e = 0.16 + 0.25 + 0.01 = 0.42
    assert fleiss_kappa(items) == pytest.approx((0.5 - 0.42) / (1 - 0.42), abs=1e-12)
    assert fleiss_kappa([Counter(x=1)]) is None


def test_fleiss_kappa_is_one_when_everyone_agrees():
    assert fleiss_kappa([Counter(x=3), Counter(y=3), Counter(tie=3)]) == pytest.approx(1.0)


def test_pair_agreement_and_wilson_interval():
    assert pair_agreement(["x", "x", "y"]) == pytest.approx(1 / 3)
    assert pair_agreement(["x"]) is None
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 0) is None
