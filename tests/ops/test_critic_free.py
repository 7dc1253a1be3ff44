import math
import random
import statistics

import pytest
import torch

from rlhfkit.ops import (
    discounted_returns,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline,
    rloo_advantages,
)

TOL = dict(rtol=0, atol=1e-6)
EPS = 1e-4


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# --- GRPO ------------------------------------------------------------------------------------------
# group 0 = [0, 1, 2]: mean 1, unbiased std 1
# group 1 = [1, 1, 4]: mean 2, centred [−1, −1, 2], unbiased var (1 + 1 + 4) / 2 = 3
# batch = [0, 1, 2, 1, 1, 4]: mean 1.5, squared deviations sum 9.5, unbiased var 9.5 / 5 = 1.9
REWARDS = [0.0, 1.0, 2.0, 1.0, 1.0, 4.0]
CENTRED = [-1.0, 0.0, 1.0, -1.0, -1.0, 2.0]


def test_grpo_group_scale_by_hand():
    out = grpo_advantages(t(REWARDS), group_size=3)
    stds = [1.0] * 3 + [math.sqrt(3)] * 3
    torch.testing.assert_close(out, t([c / (s + EPS) for c, s in zip(CENTRED, stds)]), **TOL)


def test_grpo_batch_scale_by_hand():
    out = grpo_advantages(t(REWARDS), group_size=3, scale="batch")
    torch.testing.assert_close(out, t([c / (math.sqrt(1.9) + EPS) for c in CENTRED]), **TOL)


def test_grpo_no_scale_is_dr_grpo():
    torch.testing.assert_close(grpo_advantages(t(REWARDS), group_size=3, scale="none"), t(CENTRED), **TOL)


def test_grpo_eps_is_added_to_std():
    out = grpo_advantages(t([0.0, 2.0]), group_size=2, eps=0.5)
    # mean 1, unbiased std √2
    torch.testing.assert_close(out, t([-1 / (math.sqrt(2) + 0.5), 1 / (math.sqrt(2) + 0.5)]), **TOL)


@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_grpo_matches_naive_loop(group_size):
    rng = random.Random(group_size)
    rewards = [rng.uniform(-3, 3) for _ in range(4 * group_size)]
    expected = []
    for k in range(0, len(rewards), group_size):
        group = rewards[k : k + group_size]
        mean, std = statistics.mean(group), statistics.stdev(group)
        expected += [(r - mean) / (std + EPS) for r in group]
    torch.testing.assert_close(grpo_advantages(t(rewards), group_size), t(expected), **TOL)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_group_of_one_is_zero_not_nan(scale):
    out = grpo_advantages(t([3.0, -1.0, 7.0]), group_size=1, scale=scale)
    torch.testing.assert_close(out, t([0.0, 0.0, 0.0]), **TOL)
    out = grpo_advantages(t([3.0]), group_size=1, scale=scale)  # batch of one: its std is undefined too
    torch.testing.assert_close(out, t([0.0]), **TOL)


def test_grpo_equal_rewards_give_zero():
    out = grpo_advantages(t([1.0, 1.0, 0.0, 1.0]), group_size=2)
    a = 0.5 / (math.sqrt(0.5) + EPS)  # second group: mean 0.5, unbiased std √0.5
    torch.testing.assert_close(out, t([0.0, 0.0, -a, a]), **TOL)


def test_grpo_integer_rewards_and_float32():
    out = grpo_advantages(torch.tensor([1, 0, 1, 1]), group_size=2, scale="none")
    assert out.is_floating_point()
    torch.testing.assert_close(out.double(), t([0.5, -0.5, 0.0, 0.0]), **TOL)
    out32 = grpo_advantages(t(REWARDS).float(), group_size=3)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), grpo_advantages(t(REWARDS), group_size=3), rtol=0, atol=1e-5)


def test_grpo_bad_arguments():
    with pytest.raises(ValueError, match="multiple"):
        grpo_advantages(t([1.0, 2.0, 3.0]), group_size=2)
    with pytest.raises(ValueError, match="std"):
        grpo_advantages(t([1.0, 2.0]), group_size=2, scale="std")
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(t([1.0, 2.0]), group_size=0)
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(t([[1.0, 2.0]]), group_size=2)


# --- RLOO ------------------------------------------------------------------------------------------
def naive_rloo(rewards, group_size):
    out = []
    for i, r in enumerate(rewards):
        k = i // group_size * group_size
        others = [rewards[j] for j in range(k, k + group_size) if j != i]
        out.append(r - sum(others) / len(others))
    return out


def test_rloo_by_hand():
    # 1 − (2 + 4)/2 = −2;  2 − (1 + 4)/2 = −0.5;  4 − (1 + 2)/2 = 2.5;  second group: 5 − 3 = 2, 3 − 5 = −2
    out = rloo_advantages(t([1.0, 2.0, 4.0]), group_size=3)
    torch.testing.assert_close(out, t([-2.0, -0.5, 2.5]), **TOL)
    torch.testing.assert_close(rloo_advantages(t([5.0, 3.0]), group_size=2), t([2.0, -2.0]), **TOL)


@pytest.mark.parametrize("group_size", [2, 3, 5])
def test_rloo_matches_naive_loop_and_identity(group_size):
    rng = random.Random(10 + group_size)
    rewards = [rng.uniform(-2, 2) for _ in range(3 * group_size)]
    out = rloo_advantages(t(rewards), group_size)
    torch.testing.assert_close(out, t(naive_rloo(rewards, group_size)), **TOL)
    centred = grpo_advantages(t(rewards), group_size, scale="none")
    torch.testing.assert_close(out, group_size / (group_size - 1) * centred, **TOL)


def test_rloo_group_of_one_is_zero():
    torch.testing.assert_close(rloo_advantages(t([3.0, -2.0]), group_size=1), t([0.0, 0.0]), **TOL)


def test_rloo_bad_batch():
    with pytest.raises(ValueError, match="multiple"):
        rloo_advantages(t([1.0, 2.0, 3.0]), group_size=2)


# --- REINFORCE++ -----------------------------------------------------------------------------------
def test_reinforce_pp_baseline_is_score_minus_group_mean():
    out = reinforce_pp_baseline(t([1.0, 3.0, 5.0, 10.0, 10.0, 4.0]), group_size=3)
    torch.testing.assert_close(out, t([-2.0, 0.0, 2.0, 2.0, 2.0, -4.0]), **TOL)
    torch.testing.assert_close(reinforce_pp_baseline(t([7.0]), group_size=1), t([0.0]), **TOL)


def naive_discounted_returns(rewards, mask, gamma):
    T = len(rewards)
    return [
        sum(gamma ** (s - t_) * rewards[s] for s in range(t_, T) if mask[s]) if mask[t_] else 0.0 for t_ in range(T)
    ]


def test_discounted_returns_by_hand():
    rewards = t([[1.0, 2.0, 3.0], [1.0, 2.0, 99.0], [1.0, 7.0, 3.0], [5.0, 5.0, 5.0]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 1], [0, 0, 0]])
    expected = t(
        [
            [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0],  # [2.75, 3.5, 3]
            [2.0, 2.0, 0.0],  # the reward on padding is ignored
            [1 + 0.25 * 3, 0.0, 3.0],  # a masked gap adds no reward but one step of discount
            [0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(discounted_returns(rewards, mask, gamma=0.5), expected, **TOL)


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5, 0.0])
def test_discounted_returns_matches_naive_loop(gamma):
    rng = random.Random(int(gamma * 100))
    T = 7
    rewards = [[rng.uniform(-2, 2) for _ in range(T)] for _ in range(5)]
    mask = [[float(i < n) for i in range(T)] for n in (7, 4, 1, 0)] + [[1, 1, 0, 1, 0, 1, 0]]
    expected = [naive_discounted_returns(r, m, gamma) for r, m in zip(rewards, mask)]
    out = discounted_returns(t(rewards), t(mask).bool(), gamma)
    torch.testing.assert_close(out, t(expected), **TOL)


def test_reinforce_pp_advantages_are_whitened_returns():
    rewards = t([[0.0, 0.0, 2.0], [0.5, 1.0, 9.0], [-1.0, 3.0, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    # returns: [0.5, 1, 2], [1, 1], [−1]
    torch.testing.assert_close(ret, t([[0.5, 1.0, 2.0], [1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]), **TOL)
    real = [0.5, 1.0, 2.0, 1.0, 1.0, -1.0]
    mean, var = statistics.mean(real), statistics.variance(real)
    w = [(x - mean) / math.sqrt(var + 1e-8) for x in real]
    torch.testing.assert_close(adv, t([[w[0], w[1], w[2]], [w[3], w[4], 0.0], [w[5], 0.0, 0.0]]), **TOL)
