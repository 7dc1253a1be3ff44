import random

import pytest
import torch

from rlhfkit.ops import gae, per_token_rewards, sequence_advantage

TOL = dict(rtol=0, atol=1e-6)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def naive_gae_row(rewards, values, length, gamma, lam):
    """Textbook GAE on one episode of `length` real steps; padding gets advantage 0."""
    advantages = [0.0] * len(rewards)
    running = 0.0
    for step in reversed(range(length)):
        next_value = values[step + 1] if step + 1 < length else 0.0
        delta = rewards[step] + gamma * next_value - values[step]
        running = delta + gamma * lam * running
        advantages[step] = running
    return advantages


def ragged_batch(lengths, T, seed=0):
    rng = random.Random(seed)
    rewards = [[rng.uniform(-2, 2) for _ in range(T)] for _ in lengths]  # padding holds garbage too
    values = [[rng.uniform(-2, 2) for _ in range(T)] for _ in lengths]
    mask = [[1.0 if i < n else 0.0 for i in range(T)] for n in lengths]
    return rewards, values, mask


def test_gae_by_hand():
    # δ1 = 2 - 1 = 1, A1 = 1; δ0 = 1 + 0.9·1 - 0.5 = 1.4, A0 = 1.4 + 0.9·0.8·1 = 2.12
    adv, ret = gae(t([[1.0, 2.0]]), t([[0.5, 1.0]]), t([[1, 1]]), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, t([[2.12, 1.0]]), **TOL)
    torch.testing.assert_close(ret, t([[2.62, 2.0]]), **TOL)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.7), (0.5, 1.0)])
def test_gae_matches_naive_loop_on_ragged_rows(gamma, lam):
    lengths, T = [6, 3, 1, 0, 4], 6
    rewards, values, mask = ragged_batch(lengths, T, seed=int(gamma * 100 + lam * 10))
    adv, ret = gae(t(rewards), t(values), t(mask), gamma, lam)
    expected = [naive_gae_row(r, v, n, gamma, lam) for r, v, n in zip(rewards, values, lengths)]
    torch.testing.assert_close(adv, t(expected), **TOL)
    expected_returns = [[a + v for a, v in zip(ra, rv)] for ra, rv in zip(expected, values)]
    torch.testing.assert_close(ret, t(expected_returns), **TOL)


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    lengths, T = [5, 2, 4], 5
    rewards, values, mask = ragged_batch(lengths, T, seed=7)
    adv, _ = gae(t(rewards), t(values), t(mask), gamma=1.0, lam=1.0)
    expected = [[sum(r[i:n]) - v[i] if i < n else 0.0 for i in range(T)] for r, v, n in zip(rewards, values, lengths)]
    torch.testing.assert_close(adv, t(expected), **TOL)


def test_gae_padding_gets_zero_advantage_and_value_as_return():
    rewards, values, mask = ragged_batch([2, 4], 4, seed=3)
    adv, ret = gae(t(rewards), t(values), t(mask), gamma=0.95, lam=0.9)
    padding = t(mask) == 0
    assert (adv[padding] == 0).all()
    torch.testing.assert_close(ret[padding], t(values)[padding], **TOL)


def test_gae_accepts_bool_mask_and_float32():
    rewards, values, mask = ragged_batch([3, 1], 3, seed=5)
    adv64, _ = gae(t(rewards), t(values), t(mask), 0.9, 0.9)
    adv32, _ = gae(t(rewards).float(), t(values).float(), t(mask).bool(), 0.9, 0.9)
    assert adv32.dtype == torch.float32
    torch.testing.assert_close(adv32.double(), adv64, rtol=0, atol=1e-5)


def test_per_token_rewards_score_at_last_real_token():
    scores = t([2.0, -1.0, 5.0, 3.0])
    kl = t([[0.5, 1.0, -2.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0], [1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]])
    out = per_token_rewards(scores, kl, mask, kl_coef=0.1)
    expected = t(
        [
            [-0.05, -0.1, 0.2 + 2.0],
            [-0.4 - 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],  # empty response: nothing at all
            [-0.1, -0.1 + 3.0, 0.0],
        ]
    )
    torch.testing.assert_close(out, expected, **TOL)


def test_per_token_rewards_sum_is_score_minus_beta_kl():
    kl = t([[0.3, 0.2, 0.1, 7.0]])
    out = per_token_rewards(t([1.5]), kl, t([[1, 1, 1, 0]]), kl_coef=0.2)
    assert out.sum().item() == pytest.approx(1.5 - 0.2 * 0.6, abs=1e-12)


def test_sequence_advantage_by_hand():
    rewards = t([[1.0, 2.0, 3.0], [4.0, 8.0, 8.0]])
    values = t([[0.5, 9.0, 9.0], [1.5, 7.0, 7.0]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    adv, ret = sequence_advantage(rewards, values, mask)
    # R = [6, 4], V(s) = [0.5, 1.5]
    torch.testing.assert_close(adv, t([[5.5, 5.5, 5.5], [2.5, 0.0, 0.0]]), **TOL)
    torch.testing.assert_close(ret, t([[6.0, 6.0, 6.0], [4.0, 7.0, 7.0]]), **TOL)


def test_sequence_advantage_empty_row():
    adv, ret = sequence_advantage(t([[1.0, 1.0]]), t([[0.5, 0.25]]), t([[0, 0]]))
    torch.testing.assert_close(adv, t([[0.0, 0.0]]), **TOL)
    torch.testing.assert_close(ret, t([[0.5, 0.25]]), **TOL)
