"""`rlhfkit judge`: a tiny judge trained to prefer the shorter reply agrees with that rule on held-out pairs, in
both slots; a judge biased to the first slot ends with every pair a tie; the agreement figures against
hand-worked values; every input row checked before the model loads."""

from __future__ import annotations

import importlib.util
import json

import pytest

import rlhfkit
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError
from rlhfkit.judging import model as judge_model
from rlhfkit.judging.agreement import judge_summary, reference_agreement, reference_from_rows
from rlhfkit.judging.model import Verdict
from rlhfkit.judging.pairs import Pair
from tests.helpers import read_jsonl, run_cli, write_jsonl

from .conftest import candidate_rows


def shorter(row: dict) -> tuple[str, str]:
    a, b = row["responses"]
    return (a, b) if len(a.split()) < len(b.split()) else (b, a)


@pytest.fixture(scope="module")
def held_out(length_judge, tmp_path_factory) -> dict:
    """The trained judge run once over 40 held-out pairs, with the rule's own labels as the reference."""
    d = tmp_path_factory.mktemp("held-out")
    rows = candidate_rows(40, seed=5)
    write_jsonl(d / "pairs.jsonl", rows)
    # the rule as people's labels, one pair given as preference rows the other way round (order is not a label)
    reference = [{"prompt": r["prompt"], "chosen": shorter(r)[0], "rejected": shorter(r)[1]} for r in rows]
    write_jsonl(d / "reference.jsonl", reference)
    result = rlhfkit.judge(
        model=length_judge["model"], data=str(d / "pairs.jsonl"), output_dir=str(d / "out"),
        principles=length_judge["principles"], reference=str(d / "reference.jsonl"), progress=False,
    )  # fmt: skip
    return {"dir": d, "rows": rows, "result": result}


def test_a_trained_judge_agrees_with_its_rule_on_held_out_pairs(held_out):
    report, out = held_out["result"].metrics, held_out["result"].output_dir
    prefs = read_jsonl(out / "prefs.jsonl")
    assert report["pairs"] == 40 and report["judged"] == len(prefs) >= 36
    right = sum(len(p["chosen"].split()) < len(p["rejected"].split()) for p in prefs)
    assert right / len(prefs) >= 0.9  # chance is 0.5
    assert report["order_consistent"] >= 0.9 and 0.4 <= report["first_slot_rate"] <= 0.6
    ref = report["reference"]
    assert ref["labels"] == 40 and ref["agreement"] >= 0.9 and ref["kappa"] >= 0.8
    assert json.loads((out / "report.json").read_text()) == report
    # rm and dpo read the judged pairs as they are
    assert len(load_examples(str(out / "prefs.jsonl"), "preference", "rlhfkit rm")) == len(prefs)


def test_every_pair_is_recorded_with_both_orders(held_out):
    judgments = read_jsonl(held_out["result"].output_dir / "judgments.jsonl")
    assert [j["responses"] for j in judgments] == [r["responses"] for r in held_out["rows"]]
    for j in judgments:
        v = Verdict(j["p_first"], j["p_second"])
        assert j["confidence"] == pytest.approx(v.confidence, abs=1e-12)
        assert j["answer"] == v.answer() and j["outcome"] == ("judged" if v.answer() != -1 else "tie")


def test_min_confidence_drops_the_unsure_pairs(held_out, length_judge):
    d = held_out["dir"]
    judgments = read_jsonl(held_out["result"].output_dir / "judgments.jsonl")
    cut = sorted(j["confidence"] for j in judgments if j["answer"] != -1)[10]  # above the 10 least sure
    result = rlhfkit.judge(
        model=length_judge["model"], data=str(d / "pairs.jsonl"), output_dir=str(d / "sure"),
        principles=length_judge["principles"], min_confidence=cut, progress=False,
    )  # fmt: skip
    kept = read_jsonl(d / "sure" / "prefs.jsonl")
    assert all(p["confidence"] >= cut for p in kept)
    assert result.metrics["low_confidence"] >= 10 and len(kept) == result.metrics["judged"]


def test_a_judge_biased_to_the_first_slot_ends_with_every_pair_a_tie(length_judge, tmp_path, monkeypatch, capsys):
    def always_first(model, prompts_ids, labels, pad_id, batch_size, device, progress=None):
        return [0.9] * len(prompts_ids)  # slot A, whichever reply stands there

    monkeypatch.setattr(judge_model, "first_label_probabilities", always_first)
    write_jsonl(tmp_path / "pairs.jsonl", candidate_rows(10, seed=7))
    code, _, err = run_cli(
        capsys, "judge", "--model", length_judge["model"], "--data", tmp_path / "pairs.jsonl",
        "--output-dir", tmp_path / "out", "--principles", length_judge["principles"], "--progress", "false",
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["ties"] == 10 and report["judged"] == 0 and report["first_slot_rate"] == 1.0
    assert read_jsonl(tmp_path / "out" / "prefs.jsonl") == []
    assert "order-consistent" in err and "ties" in err  # the report's table, on stderr as the run's messages
    assert f"wrote 0 judged pairs to {tmp_path / 'out' / 'prefs.jsonl'}" in err


def test_the_figures_against_hand_worked_values():
    pairs = [Pair("p", f"x{i}", f"y{i}", "") for i in range(6)]  # x_i sorts before y_i: 'first' is a
    # answers a, a, b, b, a and a tie; people preferred a, b, b, b, a, a
    verdicts = [Verdict(0.9, 0.1), Verdict(0.6, 0.4), Verdict(0.05, 0.95), Verdict(0.3, 0.7), Verdict(0.85, 0.15)]
    verdicts.append(Verdict(0.6, 0.6))
    answers = [v.answer() for v in verdicts]
    assert answers == [0, 0, 1, 1, 0, -1]
    people = [{"prompt": "p", "chosen": c, "rejected": r} for c, r in
              [("x0", "y0"), ("y1", "x1"), ("y2", "x2"), ("y3", "x3"), ("x4", "y4"), ("x5", "y5")]]  # fmt: skip
    got = reference_agreement(pairs, answers, verdicts, reference_from_rows(people), confident_at=0.8)
    # judge: first, first, second, second, first; people: first, second, second, second, first -> 4 of 5 agree
    # p_e = (3 x 2 + 2 x 3) / 25 = 0.48; kappa = (0.8 - 0.48) / (1 - 0.48)
    assert got["labels"] == 6 and got["compared"] == 5
    assert got["agreement"] == pytest.approx(0.8, abs=1e-9)
    assert got["kappa"] == pytest.approx(0.32 / 0.52, abs=1e-9)
    assert got["confident"] == {"at": 0.8, "compared": 3, "agreement": 1.0}  # confidences 0.9, 0.95, 0.85
    summary = judge_summary(verdicts, min_confidence=0.5)
    assert summary["pairs"] == 6 and summary["judged"] == 5 and summary["ties"] == 1
    assert summary["order_consistent"] == pytest.approx(5 / 6, abs=1e-9)
    assert summary["mean_confidence"] == pytest.approx((0.9 + 0.6 + 0.95 + 0.7 + 0.85) / 5, abs=1e-9)
    assert summary["first_slot_rate"] == pytest.approx(7 / 12, abs=1e-9)
    sure = judge_summary(verdicts, min_confidence=0.75)
    assert sure["judged"] == 3 and sure["low_confidence"] == 2


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "hi", "responses": ["a", "b", "c"]}, "line 2: field 'responses': expected a list of two replies"),
        ({"prompt": "hi", "responses": ["a", ""]}, "line 2: field 'responses[1]': expected a non-empty string"),
        ({"responses": ["a", "b"]}, "line 2: field 'prompt': missing"),
        ({"prompt": "hi", "chosen": "a"}, "line 2: field 'rejected': missing"),
        ({"prompt": "hi", "response": "a"}, "line 2: this row has neither 'responses' nor 'chosen'/'rejected'"),
    ],
)
def test_a_bad_row_is_one_line_naming_file_row_and_field(length_judge, tmp_path, capsys, row, message):
    write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "hi", "responses": ["a", "b"]}, row])
    code, _, err = run_cli(
        capsys, "judge", "--model", length_judge["model"], "--data", tmp_path / "pairs.jsonl",
        "--output-dir", tmp_path / "out",
    )  # fmt: skip
    assert code == 1 and f"pairs.jsonl: {message}" in err and len(err.strip().splitlines()) == 1


def test_a_prompt_too_long_for_the_judge_stops_before_judging(length_judge, tmp_path):
    write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "hi", "responses": ["a", "b " * 10]}])
    with pytest.raises(UserError, match=r"pairs.jsonl: line 1: the judge prompt is \d+ tokens, over max_length=20"):
        rlhfkit.judge(
            model=length_judge["model"], data=str(tmp_path / "pairs.jsonl"), output_dir=str(tmp_path / "o"),
            principles=length_judge["principles"], max_length=20,
        )  # fmt: skip
    assert not (tmp_path / "o" / "prefs.jsonl").exists()


def test_use_vllm_without_vllm_is_one_clear_error(length_judge, tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the vLLM tier runs it")
    write_jsonl(tmp_path / "pairs.jsonl", candidate_rows(2, seed=1))
    with pytest.raises(UserError, match=r"use_vllm: vLLM is not installed"):
        rlhfkit.judge(
            model=length_judge["model"], data=str(tmp_path / "pairs.jsonl"), output_dir=str(tmp_path / "o"),
            principles=length_judge["principles"], use_vllm=True,
        )  # fmt: skip
