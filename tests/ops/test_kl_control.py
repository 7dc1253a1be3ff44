import pytest
import torch

from rlhfkit.ops import AdaptiveKLController, FixedKLController


def test_fixed_controller_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 1000)
    ctl.update(0.0, 1000)
    assert ctl.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05


# init β = 0.1, target 6, horizon 10000, n_steps 1000 -> β·(1 + e/10)
@pytest.mark.parametrize(
    "kl,expected",
    [
        (6.6, 0.1 * 1.01),  # e = +0.1: above target, β up
        (5.4, 0.1 * 0.99),  # e = −0.1: below target, β down
        (6.0, 0.1),  # on target
        (12.0, 0.1 * 1.02),  # e = +1.0 clipped to +0.2
        (0.0, 0.1 * 0.98),  # e = −1.0 clipped to −0.2
    ],
)
def test_adaptive_controller_one_update(kl, expected):
    ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    ctl.update(kl, n_steps=1000)
    assert ctl.value == pytest.approx(expected, abs=1e-12)


def test_adaptive_controller_accepts_tensor_and_compounds():
    ctl = AdaptiveKLController(0.2, target=1.0, horizon=100)
    ctl.update(torch.tensor(1.1, dtype=torch.float64), n_steps=10)  # e = 0.1 -> ×1.01
    ctl.update(0.5, n_steps=50)  # e = −0.5 -> −0.2 -> ×0.9
    assert ctl.value == pytest.approx(0.2 * 1.01 * 0.9, abs=1e-12)


def test_adaptive_controller_state_round_trip_resumes_identically():
    a = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    a.update(9.0, 256)
    b = AdaptiveKLController(0.5, target=6.0, horizon=10000)
    b.load_state_dict(a.state_dict())
    for kl in (7.0, 3.0, 6.5):
        a.update(kl, 256)
        b.update(kl, 256)
    assert b.value == a.value


def test_adaptive_controller_rejects_bad_target():
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=10000)
