import math

import pytest
import torch

from rlhfkit.ops import kl_penalty

TOL = dict(rtol=0, atol=1e-6)


def test_estimators_by_hand():
    lp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(math.log(2), abs=1e-12)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-12)
    # r = 0.25 / 0.5: (r - 1) - log r
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(-0.5 + math.log(2), abs=1e-12)


def test_default_is_k1_and_shape_kept():
    lp, ref = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    out = kl_penalty(lp, ref)
    assert out.shape == (3, 5)
    torch.testing.assert_close(out, lp - ref, **TOL)


def test_identical_policies_give_zero():
    lp = torch.randn(2, 4, dtype=torch.float64)
    for estimator in ("k1", "k2", "k3"):
        zeros = torch.zeros(2, 4, dtype=torch.float64)
        torch.testing.assert_close(kl_penalty(lp, lp.clone(), estimator), zeros, **TOL)


def test_k2_k3_nonnegative():
    lp, ref = torch.randn(50, 7), torch.randn(50, 7)
    assert (kl_penalty(lp, ref, "k2") >= 0).all()
    assert (kl_penalty(lp, ref, "k3") >= -1e-7).all()


def test_k1_k3_unbiased_exact_expectation():
    # E_{x~p}[k] over a 3-token vocabulary must equal KL(p || q) for k1 and k3.
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    lp = torch.tensor([p], dtype=torch.float64).log()
    ref = torch.tensor([q], dtype=torch.float64).log()
    weights = torch.tensor([p], dtype=torch.float64)
    for estimator in ("k1", "k3"):
        assert (weights * kl_penalty(lp, ref, estimator)).sum().item() == pytest.approx(kl, abs=1e-12)
    # k2 is biased: its expectation is not KL here
    assert abs((weights * kl_penalty(lp, ref, "k2")).sum().item() - kl) > 1e-3


def test_unknown_estimator():
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
