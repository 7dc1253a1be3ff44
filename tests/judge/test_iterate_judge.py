"""`rlhfkit iterate --judge model:PATH`: the model labels each round as `rlhfkit judge` would; with
`--judge human+model:PATH` people label a share over HTTP, the model the rest, and the round records the model's
agreement with people on their share."""

from __future__ import annotations

import json
import re
import threading

import pytest

import rlhfkit
from rlhfkit.iterated.judges import load_judge
from rlhfkit.iterated.mixed import people_share
from rlhfkit.labelling.agreement import cohen_kappa
from tests.helpers import read_jsonl
from tests.iterate.conftest import SMALL, free_port, iterate_task, round_one_client, thanks_task  # noqa: F401

# one short round (the run's seed is the default, 42): the labels are what is tested here, not what PPO learns from them
ROUND = {**SMALL, "pairs_per_round": 16, "rm_steps": 5, "rm_initial_steps": 5, "max_steps": 2, "rounds": 1}


def model_answers(length_judge, rows: list[dict]) -> list[int]:
    judge = load_judge(f"model:{length_judge['model']}", principles=length_judge["principles"])
    return judge([r["prompt"] for r in rows], [r["responses"] for r in rows])


def as_prefs(rows: list[dict], answers: list[int]) -> list[dict]:
    out = []
    for r, answer in zip(rows, answers):
        if answer != -1:
            a, b = r["responses"]
            chosen, rejected = (a, b) if answer == 0 else (b, a)
            out.append({"prompt": r["prompt"], "chosen": chosen, "rejected": rejected})
    return out


def usable(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["responses"][0] != r["responses"][1] and all(x.strip() for x in r["responses"])]


def test_a_model_judge_labels_each_round(iterate_task, length_judge, tmp_path):  # noqa: F811
    t, out = iterate_task, tmp_path / "out"
    result = rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out),
        judge=f"model:{length_judge['model']}", judge_principles=length_judge["principles"], **ROUND,
    )  # fmt: skip
    rows = usable(read_jsonl(out / "round-1" / "candidates.jsonl"))
    answers = model_answers(length_judge, rows)
    assert read_jsonl(out / "round-1" / "pairs.jsonl") == as_prefs(rows, answers)
    record = result.metrics["rounds"][0]
    judged = record["model_judge"]
    assert judged["pairs"] == len(rows) and judged["judged"] == record["labels"] == sum(a != -1 for a in answers)
    assert judged["ties"] + judged["low_confidence"] == record["no_preference"] == answers.count(-1)
    assert json.loads((out / "round-1" / "round.json").read_text())["model_judge"] == judged


def shorter_side(a: str, b: str) -> str:
    a, b = len(a.split()), len(b.split())
    return "a" if a < b else "b" if b < a else "tie"


def test_people_label_a_share_the_model_the_rest_and_their_agreement_is_recorded(iterate_task, length_judge, tmp_path):  # noqa: F811
    out, port = tmp_path / "out", free_port()

    def person():  # labels over HTTP, preferring the reply of fewer words, as the judge was taught to
        client = round_one_client(out, port, "annotator")
        if client is None:
            return
        while (item := client.state()["item"]) is not None:
            assert client.judge(shorter_side(item["a"], item["b"]), item["id"])[0] == 200

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    t = iterate_task
    result = rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out),
        judge=f"human+model:{length_judge['model']}", judge_principles=length_judge["principles"],
        human_share=0.5, port=port, poll_seconds=0.1, **ROUND,
    )  # fmt: skip
    thread.join(timeout=10)
    rows = usable(read_jsonl(out / "round-1" / "candidates.jsonl"))
    theirs = people_share(len(rows), 0.5, "42-round-1")
    assert read_jsonl(out / "round-1" / "to_label.jsonl") == [rows[i] for i in theirs]
    record = result.metrics["rounds"][0]
    assert record["human_pairs"] == len(theirs) == round(0.5 * len(rows))
    # the round's labels: people's on their share, the model's on the others
    answers = model_answers(length_judge, rows)
    people = [
        {k: p[k] for k in ("prompt", "chosen", "rejected")}
        for p in read_jsonl(out / "round-1" / "labels" / "prefs.jsonl")
    ]
    rest = as_prefs(
        [r for i, r in enumerate(rows) if i not in theirs], [a for i, a in enumerate(answers) if i not in theirs]
    )
    assert read_jsonl(out / "round-1" / "pairs.jsonl") == people + rest
    assert record["human_labels"] == len(people) and record["model_labels"] == len(rest)
    # the agreement on people's share, worked out here from the model's answers and people's labels
    chosen_by_people = {json.dumps([p["prompt"], sorted([p["chosen"], p["rejected"]])]): p["chosen"] for p in people}
    judge_side, people_side = [], []
    for i in theirs:
        a, b = rows[i]["responses"]
        key = json.dumps([rows[i]["prompt"], sorted([a, b])])
        if answers[i] == -1 or key not in chosen_by_people:
            continue
        first = min(a, b)
        judge_side.append((a if answers[i] == 0 else b) == first)
        people_side.append(chosen_by_people[key] == first)
    agreement = record["model_agreement_with_people"]
    assert agreement["labels"] == len(people) and agreement["compared"] == len(judge_side) > 0
    assert agreement["agreement"] == pytest.approx(
        sum(j == p for j, p in zip(judge_side, people_side)) / len(judge_side), abs=1e-12
    )
    kappa = cohen_kappa(judge_side, people_side)
    assert agreement["kappa"] == (None if kappa is None else pytest.approx(kappa, abs=1e-12))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"][0]["model_agreement_with_people"] == agreement


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"judge": "model:"}, "judge='model:': give the judge model's folder or .gguf file after it"),
        ({"judge": "human+model:m", "human_share": 0.0}, "human_share must be in (0, 1], got 0.0"),
        ({"judge": "model:m", "judge_principles": "missing.txt"}, "missing.txt: judge_principles file does not exist"),
        ({"judge": "model:no-such-judge"}, "no-such-judge: judge model directory does not exist"),
    ],
)
def test_the_judge_options_are_checked(iterate_task, tmp_path, options, message):  # noqa: F811
    t = iterate_task
    with pytest.raises(rlhfkit.UserError, match=re.escape(message)):
        rlhfkit.iterate(
            model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(tmp_path / "o"), **{**ROUND, **options}
        )
