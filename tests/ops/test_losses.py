import math

import pytest
import torch

from rlhfkit.ops import bradley_terry_loss, dpo_loss, entropy_from_logits, ppo_policy_loss, value_loss

TOL = dict(rtol=0, atol=1e-6)
NEG_LOG_SIGMOID_1 = 0.31326168751822286  # −log σ(1) = log(1 + e^−1)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# --- PPO policy loss, ε = 0.2 --------------------------------------------------------------------
# token 0: A=+1, ρ=1.5 -> max(−1.5, −1.2) = −1.2   clipped (ρ > 1+ε with A > 0)
# token 1: A=−1, ρ=0.5 -> max(0.5, 0.8)   = 0.8    clipped (ρ < 1−ε with A < 0)
# token 2: A=+2, ρ=0.5 -> max(−1.0, −1.6) = −1.0   not clipped (pessimistic term is the unclipped one)
# token 3: A=−1, ρ=1.1 -> max(1.1, 1.1)   = 1.1    inside the trust region
# token 4: padding with absurd values
RATIOS = [1.5, 0.5, 0.5, 1.1, 3.0]
ADVANTAGES = t([[1.0, -1.0, 2.0, -1.0, 100.0]])
MASK = t([[1, 1, 1, 1, 0]])


def policy_inputs():
    old = t([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    logprobs = (old + t([[math.log(r) for r in RATIOS]])).requires_grad_()
    return logprobs, old


def test_ppo_policy_loss_by_hand():
    logprobs, old = policy_inputs()
    loss, stats = ppo_policy_loss(logprobs, old, ADVANTAGES, MASK, clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.0 + 1.1) / 4, abs=1e-12)
    assert stats["clipfrac"].item() == pytest.approx(0.5, abs=1e-12)
    logs = [math.log(r) for r in RATIOS[:4]]
    assert stats["approx_kl"].item() == pytest.approx(sum(0.5 * x * x for x in logs) / 4, abs=1e-12)
    assert not stats["clipfrac"].requires_grad and not stats["approx_kl"].requires_grad


def test_ppo_policy_loss_gradient_zero_on_clipped_tokens():
    logprobs, old = policy_inputs()
    loss, _ = ppo_policy_loss(logprobs, old, ADVANTAGES, MASK, clip_eps=0.2)
    loss.backward()
    # unclipped term −A·ρ has d/dlp = −A·ρ; divided by the 4 real tokens
    torch.testing.assert_close(logprobs.grad, t([[0.0, 0.0, -2.0 * 0.5 / 4, 1.1 / 4, 0.0]]), **TOL)


def test_ppo_policy_loss_on_policy_is_minus_mean_advantage():
    lp = t([[-1.0, -2.0, -3.0]])
    loss, stats = ppo_policy_loss(lp, lp.clone(), t([[1.0, 2.0, 6.0]]), t([[1, 1, 0]]), clip_eps=0.1)
    assert loss.item() == pytest.approx(-1.5, abs=1e-12)
    assert stats["clipfrac"].item() == 0.0 and stats["approx_kl"].item() == 0.0


# --- value loss, c = 0.2 -------------------------------------------------------------------------
# token 0: V=2, V_old=1, R=3: (V−R)² = 1, V_clip = 1.2 -> 3.24   clipped term larger
# token 1: V=0, V_old=1, R=2: (V−R)² = 4, V_clip = 0.8 -> 1.44   unclipped larger
# token 2: V=1, V_old=1, R=1.05: both 0.0025
VALUES = [2.0, 0.0, 1.0, 50.0]
OLD_VALUES = t([[1.0, 1.0, 1.0, -50.0]])
RETURNS = t([[3.0, 2.0, 1.05, 0.0]])
VMASK = t([[1, 1, 1, 0]])


def test_value_loss_clipped_by_hand():
    values = t([VALUES]).requires_grad_()
    loss, stats = value_loss(values, OLD_VALUES, RETURNS, VMASK, clip_range=0.2)
    assert loss.item() == pytest.approx(0.5 * (3.24 + 4.0 + 0.0025) / 3, abs=1e-12)
    assert stats["clipfrac"].item() == pytest.approx(1 / 3, abs=1e-12)
    loss.backward()
    # d/dV ½(V−R)²/3 = (V−R)/3 where the unclipped term is active; 0 on the clipped token
    torch.testing.assert_close(values.grad, t([[0.0, -2.0 / 3, -0.05 / 3, 0.0]]), **TOL)


def test_value_loss_unclipped_by_hand():
    loss, stats = value_loss(t([VALUES]), OLD_VALUES, RETURNS, VMASK, clip_range=None)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 4.0 + 0.0025) / 3, abs=1e-12)
    assert stats["clipfrac"].item() == 0.0


# --- entropy ---------------------------------------------------------------------------------------
def test_entropy_uniform_is_log_vocab():
    out = entropy_from_logits(torch.full((2, 3, 7), 0.3, dtype=torch.float64))
    assert out.shape == (2, 3)
    torch.testing.assert_close(out, torch.full((2, 3), math.log(7), dtype=torch.float64), **TOL)


def test_entropy_by_hand_and_stable():
    logits = t([[math.log(0.5), math.log(0.25), math.log(0.25)]])
    assert entropy_from_logits(logits).item() == pytest.approx(1.5 * math.log(2), abs=1e-12)
    assert entropy_from_logits(logits + 1e4).item() == pytest.approx(1.5 * math.log(2), abs=1e-9)
    assert entropy_from_logits(t([[1000.0, 1000.0, -1000.0]])).item() == pytest.approx(math.log(2), abs=1e-12)


def test_entropy_with_minus_inf_logits_has_finite_gradient():
    logits = t([[0.0, 0.0, -math.inf]]).requires_grad_()
    out = entropy_from_logits(logits)
    assert out.item() == pytest.approx(math.log(2), abs=1e-12)
    out.sum().backward()
    assert torch.isfinite(logits.grad).all()


# --- Bradley–Terry ---------------------------------------------------------------------------------
def test_bradley_terry_by_hand():
    assert bradley_terry_loss(t([2.0]), t([1.0])).item() == pytest.approx(NEG_LOG_SIGMOID_1, abs=1e-12)
    # −log σ(−1) = 1 + −log σ(1)
    assert bradley_terry_loss(t([0.0]), t([1.0])).item() == pytest.approx(1 + NEG_LOG_SIGMOID_1, abs=1e-12)


def test_bradley_terry_with_margin():
    # diffs − margin = [3−1−1, 0−1−0] = [1, −1]
    loss = bradley_terry_loss(t([3.0, 0.0]), t([1.0, 1.0]), margin=t([1.0, 0.0]))
    assert loss.item() == pytest.approx((NEG_LOG_SIGMOID_1 + 1 + NEG_LOG_SIGMOID_1) / 2, abs=1e-12)
    loss_float_margin = bradley_terry_loss(t([3.0]), t([1.0]), margin=1.0)
    assert loss_float_margin.item() == pytest.approx(NEG_LOG_SIGMOID_1, abs=1e-12)


def test_bradley_terry_large_gap_is_stable():
    assert bradley_terry_loss(t([0.0]), t([1000.0])).item() == pytest.approx(1000.0, abs=1e-9)


# --- DPO / IPO -------------------------------------------------------------------------------------
# chosen log-ratio = −1 − (−2) = 1, rejected = −3 − (−2.5) = −0.5, h = 1.5; β = 0.1, βh = 0.15
def dpo_inputs():
    return t([-1.0]).requires_grad_(), t([-3.0]), t([-2.0]), t([-2.5])


def softplus(x):
    return math.log1p(math.exp(x))  # −log σ(−x)


def test_dpo_sigmoid_by_hand():
    pc, pr, rc, rr = dpo_inputs()
    losses, chosen_rewards, rejected_rewards = dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert losses.shape == (1,)
    assert losses.item() == pytest.approx(softplus(-0.15), abs=1e-12)
    assert chosen_rewards.item() == pytest.approx(0.1, abs=1e-12)
    assert rejected_rewards.item() == pytest.approx(-0.05, abs=1e-12)
    assert not chosen_rewards.requires_grad and not rejected_rewards.requires_grad
    losses.sum().backward()
    # d/dπ_c −log σ(βh) = −β·(1 − σ(βh))
    assert pc.grad.item() == pytest.approx(-0.1 * (1 - 1 / (1 + math.exp(-0.15))), abs=1e-12)


def test_dpo_label_smoothing_by_hand():
    losses, _, _ = dpo_loss(*dpo_inputs(), beta=0.1, label_smoothing=0.1)
    assert losses.item() == pytest.approx(0.9 * softplus(-0.15) + 0.1 * softplus(0.15), abs=1e-12)


def test_ipo_by_hand():
    losses, chosen_rewards, _ = dpo_loss(*dpo_inputs(), beta=0.1, loss_type="ipo")
    assert losses.item() == pytest.approx((1.5 - 1 / 0.2) ** 2, abs=1e-12)
    assert chosen_rewards.item() == pytest.approx(0.1, abs=1e-12)


def test_dpo_batch_shapes():
    pc, pr, rc, rr = (torch.randn(5, dtype=torch.float64) for _ in range(4))
    for loss_type in ("sigmoid", "ipo"):
        outs = dpo_loss(pc, pr, rc, rr, beta=0.5, loss_type=loss_type)
        assert [o.shape for o in outs] == [(5,)] * 3


def test_dpo_bad_arguments():
    with pytest.raises(ValueError, match="hinge"):
        dpo_loss(*dpo_inputs(), beta=0.1, loss_type="hinge")
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(*dpo_inputs(), beta=0.1, loss_type="ipo", label_smoothing=0.1)
