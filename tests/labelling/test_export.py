"""Export: preference rows that rm/dpo read, ties, and the agreement report, from known answers."""

from __future__ import annotations

import json

import pytest

from rlhfkit.data.schema import load_examples
from rlhfkit.labelling.export import export
from rlhfkit.labelling.items import Pair
from rlhfkit.labelling.store import Store
from tests.helpers import read_jsonl

MARGINS = {"slightly": 0.33, "clearly": 0.67, "much": 1.0}


def answer(store: Store, annotator: str, item_id: int, outcome: str, strength=None):
    """Answer ``item_id`` as ``annotator`` so that the response ``outcome`` ("x"/"y") wins, whatever side it
    was shown on; other outcomes (tie, both_bad, skip) as they are."""
    shown = store.state(annotator)["item"]
    assert shown.item_id == item_id
    choice = outcome
    if outcome in ("x", "y"):
        choice = "a" if shown.left == outcome else "b"
    store.judge(annotator, f"request-{annotator}-{item_id}", item_id, choice, strength)


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "labels.sqlite")
    pairs = [Pair(f"prompt {i}", f"good {i}", f"bad {i}", f"c.jsonl: line {i}", 0, 1) for i in range(1, 5)]
    store.initialise(pairs, "digest", seed=3, labels_per_item=3)
    return store


def label_everything(store: Store) -> None:
    plan = {  # item -> outcome per annotator
        1: {"alice": "x", "bob": "x", "carol": "x"},
        2: {"alice": "x", "bob": "y", "carol": "tie"},
        3: {"alice": "tie", "bob": "tie", "carol": "y"},
        4: {"alice": "both_bad", "bob": "x", "carol": "skip"},
    }
    for name in ("alice", "bob", "carol"):
        for _ in range(4):
            item = store.state(name)["item"].item_id
            answer(store, name, item, plan[item][name], "much" if (item, name) == (1, "alice") else None)


def test_one_row_per_judgment_with_margins_and_the_ties_apart(store, tmp_path):
    label_everything(store)
    paths = export(store, tmp_path, MARGINS)
    prefs = read_jsonl(paths["prefs.jsonl"])
    # A/B answers: item 1 x3, item 2 alice x + bob y, item 3 carol y, item 4 bob x
    assert len(prefs) == 7
    assert sum(r["chosen"] == "good 1" and r["rejected"] == "bad 1" for r in prefs) == 3
    assert [r.get("margin") for r in prefs if r["annotator"] == "alice" and r["prompt"] == "prompt 1"] == [1.0]
    assert sum("margin" in r for r in prefs) == 1
    assert {(r["prompt"], r["chosen"]) for r in prefs if r["annotator"] == "bob"} == {
        ("prompt 1", "good 1"),
        ("prompt 2", "bad 2"),
        ("prompt 4", "good 4"),
    }
    ties = read_jsonl(paths["ties.jsonl"])
    assert sorted(t["label"] for t in ties) == ["both_bad", "tie", "tie", "tie"]
    assert all(t["responses"] == [f"good {t['prompt'][-1]}", f"bad {t['prompt'][-1]}"] for t in ties)
    # rm and dpo read the file unchanged
    examples = load_examples(str(paths["prefs.jsonl"]), "preference", "rlhfkit rm")
    assert len(examples) == 7 and examples[0].margin in (None, 1.0)


def test_majority_gives_one_row_per_pair_and_splits_go_to_ties(store, tmp_path):
    label_everything(store)
    paths = export(store, tmp_path, MARGINS, aggregate="majority")
    prefs = read_jsonl(paths["prefs.jsonl"])
    assert [(r["prompt"], r["chosen"], r.get("margin")) for r in prefs] == [("prompt 1", "good 1", 1.0)]
    ties = {t["prompt"]: t["label"] for t in read_jsonl(paths["ties.jsonl"])}
    assert ties == {"prompt 2": "split", "prompt 3": "tie", "prompt 4": "split"}


def test_agreement_report_by_hand(store, tmp_path):
    label_everything(store)
    report = json.loads(export(store, tmp_path, MARGINS)["agreement.json"].read_text())
    assert report["judgments"] == 11 and report["choices"]["skip"] == 1
    assert report["complete_pairs"] == 3  # item 4 has two answers besides carol's skip
    per_pair = {p["item"]: p["agreement"] for p in report["agreement"]["per_pair"]}
    assert per_pair == {1: 1.0, 2: 0.0, 3: pytest.approx(1 / 3, abs=1e-4), 4: 0.0}
    # Fleiss by hand: P_i = 1, 0, 1/3, 0 -> mean 1/3; shares x 5/11, y 2/11, tie 3/11, both_bad 1/11
    p_e = (25 + 4 + 9 + 1) / 121
    assert report["agreement"]["fleiss_kappa"] == pytest.approx((1 / 3 - p_e) / (1 - p_e), abs=1e-4)
    assert report["agreement"]["cohen_kappa"]["alice/bob"]["shared_pairs"] == 4
    assert report["annotators"]["carol"] == {
        **report["annotators"]["carol"],
        "labels": 3,
        "skip": 1,
        "tie": 1,
        "a_or_b": 2,
    }
    bias = report["position_bias"]
    assert bias["left_wins"] + bias["right_wins"] == 7
    assert report["seconds_per_label"]["median"] >= 0


def test_the_python_api_exports_and_names_the_files(tmp_path):
    import rlhfkit

    from .label_helpers import candidate_rows, serve

    with pytest.raises(rlhfkit.UserError, match="no labels to export"):
        rlhfkit.label(output_dir=tmp_path / "out", export=True)
    running = serve(tmp_path, candidate_rows(3))
    item = running.store.state("annotator")["item"].item_id
    running.store.judge("annotator", "request-0001", item, "b", "clearly")
    running.stop()
    result = rlhfkit.label(output_dir=tmp_path / "out", export=True, aggregate="majority")
    assert result.output == tmp_path / "out" / "prefs.jsonl" and result.metrics["judgments"] == 1
    assert read_jsonl(result.output)[0]["margin"] == 0.67
