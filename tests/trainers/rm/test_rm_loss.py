"""The reward-model loss on one batch of a fixed model: Bradley–Terry, margin and centering, by the formula."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.data.encode import encode_preference
from rlhfkit.data.schema import PreferenceExample
from rlhfkit.models.loading import load_tokenizer
from rlhfkit.models.reward import build_reward_model
from rlhfkit.trainers.rm import Pairs, collate, pair_scores, preference_accuracy, preference_loss

from .rm_helpers import preference_rows


@pytest.fixture(scope="module")
def scored_batch(tiny_lm):
    tokenizer = load_tokenizer(tiny_lm)
    torch.manual_seed(0)
    model = build_reward_model(tiny_lm, tokenizer).eval()
    with torch.no_grad():  # a larger head so the scores are far apart and the terms clearly visible
        model.score.weight.mul_(10)
    rows = preference_rows(3, seed=7)
    encoded = [
        encode_preference(tokenizer, PreferenceExample(r["prompt"], r["chosen"], r["rejected"]), 64, 32) for r in rows
    ]
    pairs = Pairs([c for c, _ in encoded], [r for _, r in encoded], [0.5, -1.0, 2.0])
    batch = collate(pairs, [0, 1, 2], tokenizer.pad_token_id)
    with torch.no_grad():
        chosen, rejected = pair_scores(model, batch)
    return chosen.double(), rejected.double(), batch.margin.double()


def naive(chosen, rejected, margin, center):
    """The formula written out, one pair at a time in plain floats."""
    total = 0.0
    for c, r, m in zip(chosen.tolist(), rejected.tolist(), margin.tolist()):
        total += -math.log(1.0 / (1.0 + math.exp(-(c - r - m)))) + center * (c + r) ** 2
    return total / len(chosen)


def test_scores_of_one_forward_are_distinct(scored_batch):
    chosen, rejected, _ = scored_batch
    assert chosen.shape == rejected.shape == (3,)
    assert float((chosen - rejected).abs().min()) > 1e-3


@pytest.mark.parametrize("use_margin, center", [(False, 0.0), (True, 0.0), (False, 0.3), (True, 0.3)])
def test_loss_matches_the_formula(scored_batch, use_margin, center):
    chosen, rejected, margin = scored_batch
    expected = naive(chosen, rejected, margin if use_margin else torch.zeros(3), center)
    got = preference_loss(chosen, rejected, margin if use_margin else None, center)
    assert float(got) == pytest.approx(expected, abs=1e-9)


def test_margin_and_centering_shift_the_loss_by_their_terms(scored_batch):
    chosen, rejected, margin = scored_batch
    plain = float(preference_loss(chosen, rejected, None, 0.0))
    with_margin = float(preference_loss(chosen, rejected, margin, 0.0))
    with_center = float(preference_loss(chosen, rejected, None, 0.25))
    diff = chosen - rejected
    # margin: mean of log σ(d) − log σ(d − m) per pair; centering: 0.25 · mean (s_c + s_r)².
    margin_term = float((torch.nn.functional.logsigmoid(diff) - torch.nn.functional.logsigmoid(diff - margin)).mean())
    assert with_margin - plain == pytest.approx(margin_term, abs=1e-9)
    assert abs(margin_term) > 0.01
    assert with_center - plain == pytest.approx(0.25 * float(((chosen + rejected) ** 2).mean()), abs=1e-9)
    assert with_center > plain


def test_accuracy_counts_ties_half():
    chosen = torch.tensor([1.0, 0.0, 2.0, -1.0])
    rejected = torch.tensor([0.0, 0.0, 3.0, -2.0])
    assert float(preference_accuracy(chosen, rejected)) == pytest.approx((1 + 0.5 + 0 + 1) / 4)
