"""The ensemble objectives PPO can optimise (Coste et al. 2023), by hand, and as the reward model's reward."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.config.online import OnlineRewardArgs
from rlhfkit.models.reward import ScoreOutput
from rlhfkit.ops import ensemble_reward
from rlhfkit.trainers.online.rewards import RewardBatch, RewardModelReward

TOL = dict(rtol=0, atol=1e-6)
# three members' scores of two completions
SCORES = torch.tensor([[1.0, 0.0], [2.0, 0.5], [3.0, -0.5]])


def test_objectives_by_hand():
    torch.testing.assert_close(ensemble_reward(SCORES, "mean"), torch.tensor([2.0, 0.0]), **TOL)
    torch.testing.assert_close(ensemble_reward(SCORES, "worst-case"), torch.tensor([1.0, -0.5]), **TOL)
    # unbiased std over 3 members: sqrt(((1)^2 + 0 + 1^2) / 2) = 1 and sqrt((0 + 0.25 + 0.25) / 2) = 0.5
    torch.testing.assert_close(ensemble_reward(SCORES, "uncertainty", k=2.0), torch.tensor([0.0, -1.0]), **TOL)


def test_one_member_is_its_score_under_every_objective():
    one = torch.tensor([[0.3, -1.2, 4.0]])
    for objective in ("mean", "worst-case", "uncertainty"):
        torch.testing.assert_close(ensemble_reward(one, objective, k=3.0), one[0], **TOL)


def test_pessimism_order_and_bad_input():
    scores = torch.randn(5, 40)
    mean, worst = ensemble_reward(scores, "mean"), ensemble_reward(scores, "worst-case")
    assert (worst <= mean).all() and (ensemble_reward(scores, "uncertainty", 1.0) <= mean).all()
    with pytest.raises(ValueError, match="unknown ensemble objective"):
        ensemble_reward(scores, "median")
    with pytest.raises(ValueError, match=r"\[K, B\]"):
        ensemble_reward(scores[0], "mean")


class EnsembleScorer:
    stats = {"mean": 1.0, "std": 2.0}
    conservative_k = 2.0

    def score(self, prompts, responses, batch_size=32, finished=None):
        return ScoreOutput(SCORES.mean(0), SCORES.std(0), SCORES)


@pytest.mark.parametrize(
    "mode, expected",
    [("mean", [2.0, 0.0]), ("worst-case", [1.0, -0.5]), ("uncertainty", [0.0, -1.0]), ("conservative", [0.0, -1.0])],
)
def test_the_reward_model_reward_uses_the_objective_then_normalises(mode, expected):
    reward = RewardModelReward(EnsembleScorer(), OnlineRewardArgs(ensemble_mode=mode))
    batch = RewardBatch(["p", "p"], ["a", "b"], [[1], [2]], [True, True])
    raw, used = reward(batch)
    torch.testing.assert_close(raw, torch.tensor([2.0, 0.0]), **TOL)  # what is logged: the mean
    torch.testing.assert_close(used, (torch.tensor(expected) - 1.0) / 2.0, **TOL)
    assert not any(math.isnan(v) for v in used.tolist())
