import math
import random

import pytest
import torch

from rlhfkit.ops import aggregate_loss, ppo_policy_loss, ppo_policy_loss_per_token, sequence_ratio_policy_loss

TOL = dict(rtol=0, atol=1e-6)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# --- clip-higher, ε_low = 0.2 ------------------------------------------------------------------------
# token 0: A=+1, ρ=1.5   ε_high=0.2: max(−1.5, −1.2) = −1.2 clipped;  ε_high=0.6: clip to 1.6 -> −1.5 free
# token 1: A=−1, ρ=0.5   max(0.5, 0.8) = 0.8, clipped at 1 − ε_low whatever ε_high
# token 2: A=+2, ρ=0.5   max(−1.0, −1.6) = −1.0
# token 3: A=−1, ρ=1.1   1.1
# token 4: padding, ρ = e^40 would be inf-ish garbage
RATIOS = [1.5, 0.5, 0.5, 1.1]
ADVANTAGES = t([[1.0, -1.0, 2.0, -1.0, 100.0]])
MASK = t([[1, 1, 1, 1, 0]])


def policy_inputs():
    old = t([[-1.0, -2.0, -0.5, -3.0, -41.0]])
    logprobs = (old + t([[math.log(r) for r in RATIOS] + [40.0]])).requires_grad_()
    return logprobs, old


def test_per_token_loss_by_hand():
    logprobs, old = policy_inputs()
    per_token, stats = ppo_policy_loss_per_token(logprobs, old, ADVANTAGES, MASK, clip_eps=0.2)
    torch.testing.assert_close(per_token, t([[-1.2, 0.8, -1.0, 1.1, 0.0]]), **TOL)
    assert stats["clipfrac"].item() == pytest.approx(0.5, abs=1e-12)


def test_clip_higher_by_hand():
    logprobs, old = policy_inputs()
    per_token, stats = ppo_policy_loss_per_token(logprobs, old, ADVANTAGES, MASK, clip_eps=0.2, clip_eps_high=0.6)
    torch.testing.assert_close(per_token, t([[-1.5, 0.8, -1.0, 1.1, 0.0]]), **TOL)
    assert stats["clipfrac"].item() == pytest.approx(0.25, abs=1e-12)
    loss, _ = ppo_policy_loss(logprobs, old, ADVANTAGES, MASK, 0.2, clip_eps_high=0.6)
    assert loss.item() == pytest.approx((-1.5 + 0.8 - 1.0 + 1.1) / 4, abs=1e-12)
    loss.backward()
    # the upper clip no longer binds on token 0: d(−A·ρ)/dlp = −A·ρ = −1.5, over 4 real tokens
    torch.testing.assert_close(logprobs.grad, t([[-1.5 / 4, 0.0, -2.0 * 0.5 / 4, 1.1 / 4, 0.0]]), **TOL)


def test_clip_higher_only_moves_the_upper_bound():
    logprobs, old = policy_inputs()
    # ε_high = 0.3: token 0 clipped at 1.3 -> −1.3; the lower bound 0.8 still clips token 1
    per_token, _ = ppo_policy_loss_per_token(logprobs, old, ADVANTAGES, MASK, 0.2, clip_eps_high=0.3)
    torch.testing.assert_close(per_token, t([[-1.3, 0.8, -1.0, 1.1, 0.0]]), **TOL)


def test_clip_eps_high_none_is_symmetric_and_reduction_is_token_mean():
    logprobs, old = policy_inputs()
    default, stats = ppo_policy_loss(logprobs, old, ADVANTAGES, MASK, 0.2)
    explicit, _ = ppo_policy_loss(logprobs, old, ADVANTAGES, MASK, 0.2, clip_eps_high=0.2)
    per_token, stats_per_token = ppo_policy_loss_per_token(logprobs, old, ADVANTAGES, MASK, 0.2)
    assert default.item() == explicit.item()
    assert default.item() == pytest.approx(aggregate_loss(per_token, MASK, "token-mean").item(), abs=1e-12)
    assert stats.keys() == stats_per_token.keys() == {"clipfrac", "approx_kl"}


def test_negative_clip_eps_is_rejected():
    logprobs, old = policy_inputs()
    with pytest.raises(ValueError, match="clip_eps"):
        ppo_policy_loss_per_token(logprobs, old, ADVANTAGES, MASK, 0.2, clip_eps_high=-0.1)


# --- sequence-level ratio, ε = 0.2 -------------------------------------------------------------------
# row 0: log-ratios [0.1, 0.2, pad 50] -> ρ = e^0.3 = 1.3499, A = +1: max(−1.3499, −1.2) = −1.2, clipped
# row 1: log-ratios [−0.05, 0, 0]      -> ρ = e^−0.05 = 0.9512, A = −2: 2ρ = 1.9025 on each token, free
# row 2: no real token -> 0, left out of clipfrac
SEQ_LOG_RATIOS = [[0.1, 0.2, 50.0], [-0.05, 0.0, 0.0], [3.0, 3.0, 3.0]]
SEQ_MASK = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
SEQ_ADVANTAGES = t([1.0, -2.0, 5.0])


def sequence_inputs():
    old = t([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9], [-1.0, -1.0, -1.0]])
    return (old + t(SEQ_LOG_RATIOS)).requires_grad_(), old


def test_sequence_ratio_by_hand():
    logprobs, old = sequence_inputs()
    per_token, stats = sequence_ratio_policy_loss(logprobs, old, SEQ_ADVANTAGES, SEQ_MASK, clip_eps=0.2)
    row1 = 2 * math.exp(-0.05)
    torch.testing.assert_close(per_token, t([[-1.2, -1.2, 0.0], [row1] * 3, [0.0] * 3]), **TOL)
    assert stats["clipfrac"].item() == pytest.approx(0.5, abs=1e-12)
    assert stats["approx_kl"].item() == pytest.approx(0.5 * (0.01 + 0.04 + 0.0025) / 5, abs=1e-12)
    loss = aggregate_loss(per_token, SEQ_MASK, "seq-mean-token-mean")
    assert loss.item() == pytest.approx((-1.2 + row1) / 2, abs=1e-12)
    loss.backward()
    # row 1: d(−A·exp(Σ log-ratios))/dlp_t = −A·ρ for each of its tokens, times ½ for the mean over 2 rows
    grad = t([[0.0, 0.0, 0.0], [row1 / 2] * 3, [0.0] * 3])
    torch.testing.assert_close(logprobs.grad, grad, **TOL)


def test_sequence_ratio_clip_higher_and_token_advantages():
    logprobs, old = sequence_inputs()
    per_token, stats = sequence_ratio_policy_loss(
        logprobs, old, SEQ_ADVANTAGES.unsqueeze(-1).expand(3, 3), SEQ_MASK, 0.2, clip_eps_high=0.4
    )
    row0, row1 = -math.exp(0.3), 2 * math.exp(-0.05)  # 1.3499 < 1.4: row 0 no longer clipped
    torch.testing.assert_close(per_token, t([[row0, row0, 0.0], [row1] * 3, [0.0] * 3]), **TOL)
    assert stats["clipfrac"].item() == 0.0


def test_sequence_ratio_matches_naive_per_sequence_loop():
    rng = random.Random(3)
    B, T, eps = 6, 5, 0.2
    lengths = [5, 3, 1, 4, 2, 5]
    lp = [[rng.uniform(-3, -0.1) for _ in range(T)] for _ in range(B)]
    old = [[x + rng.uniform(-0.15, 0.15) for x in row] for row in lp]
    adv = [rng.uniform(-2, 2) for _ in range(B)]
    expected = []
    for b, n in enumerate(lengths):
        ratio = math.exp(sum(lp[b][i] - old[b][i] for i in range(n)))
        expected.append(max(-adv[b] * ratio, -adv[b] * min(max(ratio, 1 - eps), 1 + eps)))
    mask = t([[float(i < n) for i in range(T)] for n in lengths])
    per_token, _ = sequence_ratio_policy_loss(t(lp), t(old), t(adv), mask, eps)
    loss = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(sum(expected) / B, abs=1e-12)
