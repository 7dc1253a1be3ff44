"""The EMA reference (Xu et al. 2024): ref <- (1 - alpha) ref + alpha policy, by hand; and in PPO, alpha = 1
trains exactly as copying the policy into the reference every step (--ref-update-steps 1)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.ops import ema_update


def _pair():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()


def test_ema_by_hand():
    ref, policy = _pair()
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    ema_update(ref, policy, 0.25)
    for name, value in ref.state_dict().items():
        expected = 0.75 * before[name] + 0.25 * policy.state_dict()[name]
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-12)
    for p in policy.parameters():
        assert not p.grad  # the policy is only read


def test_alpha_zero_keeps_and_one_copies():
    ref, policy = _pair()
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    ema_update(ref, policy, 0.0)
    assert all(torch.equal(v, before[k]) for k, v in ref.state_dict().items())
    ema_update(ref, policy, 1.0)
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in ref.state_dict().items())


def test_repeated_updates_converge_geometrically():
    ref, policy = _pair()
    gap0 = (ref.weight - policy.weight).abs().max()
    for _ in range(10):
        ema_update(ref, policy, 0.5)
    gap = (ref.weight - policy.weight).abs().max()
    torch.testing.assert_close(gap, gap0 * 0.5**10, rtol=1e-9, atol=1e-12)


def test_bad_alpha_and_mismatched_models():
    ref, policy = _pair()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ema_update(ref, policy, 1.5)
    with pytest.raises(ValueError, match="no 'weight'"):
        ema_update(ref, torch.nn.Sequential(torch.nn.Linear(3, 2)).double(), 0.5)
