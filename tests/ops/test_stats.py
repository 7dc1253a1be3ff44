import math

import pytest
import torch

from rlhfkit.ops import explained_variance, masked_mean, masked_var, masked_whiten

TOL = dict(rtol=0, atol=1e-6)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# x's real entries are {1, 2, 4}; the 3 and the 5, 6 are padding and must be ignored.
X = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = t([[1, 1, 0], [1, 0, 0]])


def test_masked_mean_whole_batch():
    assert masked_mean(X, MASK).item() == pytest.approx(7 / 3, abs=1e-12)


def test_masked_mean_per_row():
    torch.testing.assert_close(masked_mean(X, MASK, dim=-1), t([1.5, 4.0]), **TOL)


def test_masked_mean_accepts_bool_mask():
    assert masked_mean(X, MASK.bool()).item() == pytest.approx(7 / 3, abs=1e-12)


def test_masked_mean_empty_mask_is_zero_not_nan():
    assert masked_mean(X, torch.zeros_like(X)).item() == 0.0
    torch.testing.assert_close(masked_mean(X, t([[1, 1, 1], [0, 0, 0]]), dim=-1), t([2.0, 0.0]), **TOL)


def test_masked_var_by_hand():
    # deviations from 7/3: -4/3, -1/3, 5/3 -> squares sum to 42/9
    assert masked_var(X, MASK, unbiased=False).item() == pytest.approx(42 / 9 / 3, abs=1e-12)
    assert masked_var(X, MASK, unbiased=True).item() == pytest.approx(42 / 9 / 2, abs=1e-12)


def test_masked_var_unbiased_needs_two_elements():
    with pytest.raises(ValueError):
        masked_var(X, t([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten_by_hand():
    mean, var = 7 / 3, 7 / 3
    scale = 1 / math.sqrt(var + 1e-8)
    expected = t([[(v - mean) * scale for v in row] for row in X.tolist()])
    torch.testing.assert_close(masked_whiten(X, MASK), expected, **TOL)
    out = masked_whiten(X, MASK)
    assert masked_mean(out, MASK).item() == pytest.approx(0.0, abs=1e-12)
    assert masked_var(out, MASK).item() == pytest.approx(1.0, abs=1e-6)


def test_masked_whiten_keep_mean():
    mean, var = 7 / 3, 7 / 3
    scale = 1 / math.sqrt(var + 1e-8)
    expected = t([[(v - mean) * scale + mean for v in row] for row in X.tolist()])
    out = masked_whiten(X, MASK, shift_mean=False)
    torch.testing.assert_close(out, expected, **TOL)
    assert masked_mean(out, MASK).item() == pytest.approx(mean, abs=1e-12)


def test_explained_variance_by_hand():
    values = t([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    returns = t([[1.0, 2.0, -7.0], [4.0, 50.0, 0.0]])
    # returns {1, 2, 4}: var 14/9; residuals {0, 0, 1}: var 2/9 -> ev = 1 - 1/7
    assert explained_variance(values, returns, MASK).item() == pytest.approx(6 / 7, abs=1e-12)


def test_explained_variance_perfect_and_constant():
    returns = t([[1.0, 2.0, 3.0]])
    mask = t([[1, 1, 1]])
    assert explained_variance(returns.clone(), returns, mask).item() == pytest.approx(1.0, abs=1e-12)
    assert explained_variance(returns * 0, returns, mask).item() == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask).item())
