"""The reward model against a judge: agreement on pairs, best-of-N headroom, the over-optimisation curve (hand-worked
numbers), and `rlhfkit eval` reporting them for a policy's own samples and held-out pairs."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification

import rlhfkit
from rlhfkit.inference import evaluate
from rlhfkit.inference.diagnostics import (
    agreement,
    best_of_n,
    by_prompt,
    gold_peak_before_end,
    on_policy_agreement,
    overoptimisation_curve,
)
from rlhfkit.models.loading import load_tokenizer


def test_agreement_leaves_out_judge_ties_and_counts_reward_model_ties_half():
    pairs = [
        (2.0, 1.0, 5.0, 3.0),  # agree
        (1.0, 2.0, 5.0, 3.0),  # disagree
        (1.0, 1.0, 5.0, 3.0),  # the reward model ties: half
        (3.0, 1.0, 4.0, 4.0),  # the judge ties: left out
    ]
    assert agreement(pairs) == {"pairs": 3, "agreement": pytest.approx(1.5 / 3)}
    assert agreement([]) == {"pairs": 0, "agreement": None}


def rows(table: dict[str, list[tuple[float, float]]]) -> list[dict]:
    """Rows (prompt, score, gold) interleaved as the evaluation samples them: each copy of the prompt list in turn."""
    out = []
    for i in range(max(len(v) for v in table.values())):
        for prompt, replies in table.items():
            if i < len(replies):
                score, gold = replies[i]
                out.append({"prompt": prompt, "response": f"{prompt}{i}", "score": score, "gold": gold})
    return out


def test_best_of_n_by_hand():
    sample = rows(
        {
            "a": [(0.1, 1.0), (0.9, 3.0), (0.5, 5.0)],  # the reward model picks gold 3; judge 5; random 3
            "b": [(0.7, 2.0), (0.2, 4.0), (0.3, 0.0)],  # picks 2; judge 4; random 2
        }
    )
    assert [len(g) for g in by_prompt(sample)] == [3, 3]
    best = best_of_n(sample)
    assert best["n"] == 3 and best["prompts"] == 2
    assert best["random"] == pytest.approx(2.5) and best["rm_pick"] == pytest.approx(2.5)
    assert best["judge_pick"] == pytest.approx(4.5) and best["captured"] == pytest.approx(0.0)
    # N is the fewest replies a prompt has: prompt b's third reply leaves, a's third too
    two = best_of_n(rows({"a": [(0.1, 1.0), (0.9, 3.0), (0.5, 5.0)], "b": [(0.7, 2.0), (0.2, 4.0)]}))
    assert two["n"] == 2 and two["rm_pick"] == pytest.approx((3.0 + 2.0) / 2)
    assert two["judge_pick"] == pytest.approx(3.5) and two["random"] == pytest.approx(2.5)
    assert two["captured"] == pytest.approx((2.5 - 2.5) / (3.5 - 2.5))
    assert best_of_n(rows({"a": [(0.1, 1.0)]}))["n"] == 0
    # on-policy agreement over the pairs within each prompt: a: (1,3) agree (0.1<0.9), (1,5) agree, (3,5) disagree;
    # b: (2,4) disagree, (2,0) agree (0.7>0.3), (4,0) disagree (0.2<0.3)
    assert on_policy_agreement(sample) == {"pairs": 6, "agreement": pytest.approx(3 / 6)}


def test_the_curve_and_where_gold_peaked():
    metrics = [
        {"step": 1, "reward/score": 1.0, "kl/ref": 0.1, "reward/gold": 2.0},
        {"step": 2, "reward/score": 1.5, "kl/ref": 0.5},  # no gold at this step: not on the curve
        {"step": 3, "reward/score": 2.0, "kl/ref": 1.0, "reward/gold": 3.0},
        {"step": 4, "reward/score": 3.0, "kl/ref": 4.0, "reward/gold": 2.5},
    ]
    curve = overoptimisation_curve(metrics)
    assert [(r["step"], r["kl"], r["score"], r["gold"]) for r in curve] == [
        (1, 0.1, 1.0, 2.0),
        (3, 1.0, 2.0, 3.0),
        (4, 4.0, 3.0, 2.5),
    ]
    peak = gold_peak_before_end(curve)
    assert peak == {"peak_step": 3, "peak_gold": 3.0, "end_gold": 2.5, "fall": 0.5, "score_rise": 1.0}
    assert gold_peak_before_end([]) is None


class JudgeLikeScorer:
    """A reward model that scores a reply by its length times ``sign``: with the length judge below, +1 agrees
    with the judge on every pair, -1 on none."""

    def __init__(self, sign: float):
        self.sign = sign

    def score(self, prompts, responses, batch_size=32, finished=None):
        texts = [r if isinstance(r, str) else r[-1]["content"] for r in responses]
        return type("Scores", (), {"mean": torch.tensor([self.sign * len(t) for t in texts], dtype=torch.float)})()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_eval_reports_agreement_and_headroom_from_several_samples_and_held_out_pairs(
    tiny_model_dir, tmp_path, monkeypatch, sign
):
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)  # a folder to name
    rm.config.pad_token_id = load_tokenizer(str(tiny_model_dir)).pad_token_id
    rm.save_pretrained(tmp_path / "rm")
    monkeypatch.setattr(evaluate.RewardScorer, "load", classmethod(lambda cls, *a, **kw: JudgeLikeScorer(sign)))
    monkeypatch.setattr(evaluate, "get_judge", lambda name: lambda prompt, reply: float(len(reply)))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"the cat {w}"}) + "\n" for w in "sat ran hid ate".split()))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"prompt": "p", "chosen": c, "rejected": r}) + "\n"
            for c, r in [("a long reply", "short"), ("longer still", "tiny"), ("x", "a longer one")]
        )
    )
    out = tmp_path / "eval.json"
    rlhfkit.evaluate(
        model=str(tiny_model_dir), data=str(prompts), output=str(out), reward_model=str(tmp_path / "rm"),
        gold_judge="lengths", samples_per_prompt=4, pairs=str(pairs), max_new_tokens=12, temperature=1.0,
    )  # fmt: skip
    result = json.loads(out.read_text())
    samples = [json.loads(line) for line in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16 and result["best_of_n/n"] == 4 and result["best_of_n/prompts"] == 4
    assert result["rm_judge/on_policy_pairs"] > 0  # a random model's replies differ in length
    # the reward model is the judge (sign +1) or its reverse (-1): it picks the judge's best reply, or its worst
    assert result["rm_judge/on_policy_agreement"] == pytest.approx(1.0 if sign > 0 else 0.0)
    assert result["best_of_n/judge_pick"] > result["best_of_n/random"]
    assert result["best_of_n/captured"] == pytest.approx(1.0) if sign > 0 else result["best_of_n/captured"] < 0
    # held-out pairs: the labels prefer the longer reply in two of three; the judge (length) agrees with both
    assert result["rm/pairs_accuracy"] == pytest.approx(2 / 3 if sign > 0 else 1 / 3)
    assert result["rm_judge/pairs_agreement"] == pytest.approx(1.0 if sign > 0 else 0.0)
    assert result["judge/pairs_accuracy"] == pytest.approx(2 / 3)


def test_pairs_without_a_reward_model_is_an_error(tiny_model_dir, tmp_path):
    with pytest.raises(rlhfkit.UserError, match="reward"):
        rlhfkit.evaluate(model=str(tiny_model_dir), data="d", output="o", pairs="p.jsonl")
