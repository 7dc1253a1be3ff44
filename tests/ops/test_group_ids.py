"""The group estimators read each row's prompt group from ``group_ids``: rows in any order give the contiguous
batch's advantages, permuted, and a group may be smaller than the others (a row left out)."""

import math

import pytest
import torch

from rlhfkit.ops import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    Groups,
    grpo_advantages,
    per_token_rewards,
    reinforce_pp_baseline,
    rloo_advantages,
)

TOL = dict(rtol=0, atol=1e-6)
EPS = 1e-4


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# Two prompts × G = 3, contiguous: group 0 = [0, 1, 2] (mean 1, unbiased std 1), group 1 = [1, 1, 4] (mean 2,
# centred [-1, -1, 2], unbiased std √3).
REWARDS = [0.0, 1.0, 2.0, 1.0, 1.0, 4.0]
# The same six rows shuffled: row i of the shuffled batch is row PERM[i] of the contiguous one.
PERM = [4, 0, 5, 2, 1, 3]
SHUFFLED = [REWARDS[i] for i in PERM]  # [1, 0, 4, 2, 1, 1]
SHUFFLED_IDS = torch.tensor([1, 0, 1, 0, 0, 1])


def test_shuffled_rows_get_the_contiguous_advantages_permuted_by_hand():
    # GRPO with the group's std: contiguous [-1, 0, 1 | -1/√3, -1/√3, 2/√3], read in PERM's order
    s3 = math.sqrt(3) + EPS
    by_hand = [-1 / s3, -1 / (1 + EPS), 2 / s3, 1 / (1 + EPS), 0.0, -1 / s3]
    shuffled = grpo_advantages(t(SHUFFLED), group_ids=SHUFFLED_IDS)
    torch.testing.assert_close(shuffled, t(by_hand), **TOL)
    contiguous = grpo_advantages(t(REWARDS), group_size=3)
    torch.testing.assert_close(shuffled, contiguous[PERM], **TOL)
    # Dr. GRPO and REINFORCE++-baseline: the centred rewards [-1, 0, 1 | -1, -1, 2], permuted
    centred = [-1.0, -1.0, 2.0, 1.0, 0.0, -1.0]
    torch.testing.assert_close(grpo_advantages(t(SHUFFLED), scale="none", group_ids=SHUFFLED_IDS), t(centred), **TOL)
    torch.testing.assert_close(reinforce_pp_baseline(t(SHUFFLED), group_ids=SHUFFLED_IDS), t(centred), **TOL)
    # the batch's std does not depend on the order: √1.9
    batch = grpo_advantages(t(SHUFFLED), scale="batch", group_ids=SHUFFLED_IDS)
    torch.testing.assert_close(batch, t([c / (math.sqrt(1.9) + EPS) for c in centred]), **TOL)
    # RLOO: r_i − mean of the other two of its group; contiguous [-1.5, 0, 1.5 | -1.5, -1.5, 3]
    rloo = rloo_advantages(t(SHUFFLED), group_ids=SHUFFLED_IDS)
    torch.testing.assert_close(rloo, t([-1.5, -1.5, 3.0, 1.5, 0.0, -1.5]), **TOL)
    torch.testing.assert_close(rloo, rloo_advantages(t(REWARDS), group_size=3)[PERM], **TOL)


def test_groups_of_different_sizes_and_any_ids():
    # group 7 = [0, 1, 2] (mean 1, std 1); group 3 = [1, 4], a row of it left out (mean 2.5, std √4.5); group 5 =
    # one row: no one to compare it with, advantage 0
    rewards, ids = t([1.0, 0.0, 4.0, 1.0, 9.0, 2.0]), torch.tensor([3, 7, 3, 7, 5, 7])
    s2 = math.sqrt(4.5) + EPS
    expected = [-1.5 / s2, -1 / (1 + EPS), 1.5 / s2, 0.0, 0.0, 1 / (1 + EPS)]
    torch.testing.assert_close(grpo_advantages(rewards, group_ids=ids), t(expected), **TOL)
    # RLOO: 1 − 4 = −3 and 4 − 1 = 3 in the pair; 0 − (1 + 2)/2 = −1.5 ... in the three
    torch.testing.assert_close(rloo_advantages(rewards, group_ids=ids), t([-3.0, -1.5, 3.0, 0.0, 0.0, 1.5]), **TOL)
    groups = Groups(ids)
    assert groups.sizes.tolist() == [2, 1, 3] and groups.ragged  # groups in increasing id: 3, 5, 7
    torch.testing.assert_close(groups.rows(groups.matrix(rewards)), rewards, **TOL)  # there and back


def test_group_estimators_read_group_ids_from_their_config():
    mask = t([[1, 1, 1]] * 6)
    token_rewards = per_token_rewards(t(SHUFFLED), torch.zeros(6, 3, dtype=torch.float64), mask, kl_coef=0.0)
    contiguous_rewards = per_token_rewards(t(REWARDS), torch.zeros(6, 3, dtype=torch.float64), mask, kl_coef=0.0)
    for name in ("grpo", "rloo", "reinforce_pp_baseline"):
        estimator = ADVANTAGE_ESTIMATORS[name]
        # the group size says nothing once the rows name their groups
        shuffled, _ = estimator(token_rewards, mask, AdvantageConfig(group_size=3, group_ids=SHUFFLED_IDS))
        contiguous, _ = estimator(contiguous_rewards, mask, AdvantageConfig(group_size=3))
        torch.testing.assert_close(shuffled, contiguous[PERM], **TOL)
        # read as contiguous groups instead, the shuffled rows give other advantages
        wrong, _ = estimator(token_rewards, mask, AdvantageConfig(group_size=3))
        assert not torch.allclose(wrong, shuffled)


def test_group_ids_are_checked():
    with pytest.raises(ValueError, match="either group_size or group_ids"):
        grpo_advantages(t(REWARDS), 3, group_ids=torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="either group_size or group_ids"):
        rloo_advantages(t(REWARDS))
    with pytest.raises(ValueError, match="shape"):
        grpo_advantages(t(REWARDS), group_ids=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="integers"):
        Groups(torch.zeros(6))
