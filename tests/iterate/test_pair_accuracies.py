"""A round's reward-model accuracies: each set of pairs scored by one loaded model, ties counted one half."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlhfkit.iterated import models


def test_every_set_is_scored_by_one_load_of_the_reward_model(monkeypatch):
    loads = []

    class Scorer:  # scores a reply by its length
        def score(self, prompts, replies):
            return SimpleNamespace(mean=torch.tensor([float(len(r)) for r in replies]))

    monkeypatch.setattr(models.RewardScorer, "load", lambda *a: loads.append(a) or Scorer())
    longer = [{"prompt": "p", "chosen": "long reply", "rejected": "short"}] * 3
    tie = [{"prompt": "p", "chosen": "same", "rejected": "size"}]
    wrong = [{"prompt": "p", "chosen": "a", "rejected": "abc"}]
    got = models.pair_accuracies("rm", [longer + wrong, tie, [], wrong], "cpu")
    assert got == [0.75, 0.5, None, 0.0] and len(loads) == 1
    assert models.pair_accuracies("rm", [[], []], "cpu") == [None, None] and len(loads) == 1  # nothing to score
