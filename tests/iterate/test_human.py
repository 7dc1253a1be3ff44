"""`rlhfkit iterate --judge human`: a round's pairs on the labelling page, the round waiting for the labels,
a restart that keeps every label and every annotator's link, and the whole loop labelled over HTTP and in a
real browser."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

import rlhfkit
from rlhfkit.iterated.human import TOKENS_FILE, HumanJudge, round_finished
from rlhfkit.labelling.store import Store
from tests.helpers import read_jsonl, write_jsonl
from tests.labelling.label_helpers import candidate_rows

from .conftest import SMALL, free_port, round_one_client


class Stop(Exception):
    """Stands for the process being stopped while a round waits."""


def label_some(db_path, annotator: str, n: int, choice=lambda a, b: "a" if "thanks" in a else "b") -> int:
    """``annotator`` answers up to ``n`` pairs through the store, as the page would; returns how many."""
    store = Store(db_path)
    try:
        done = 0
        while done < n:
            shown = store.state(annotator)["item"]
            if shown is None:
                break
            store.judge(annotator, f"req-{annotator}-{shown.item_id}", shown.item_id, choice(shown.a, shown.b))
            done += 1
        return done
    finally:
        store.close()


def test_a_round_waits_for_its_labels_and_a_restart_keeps_them(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rlhfkit.iterated.human")
    round_dir = tmp_path / "round-1"
    round_dir.mkdir()
    candidates = write_jsonl(tmp_path / "to_label.jsonl", candidate_rows(6))
    db = round_dir / "labels" / "labels.sqlite"

    def stop_after_two(store):
        label_some(db, "alice", 2)
        raise Stop

    first = HumanJudge(tmp_path, ["alice", "bob"], 1, "127.0.0.1", 0, poll=0.01)
    with pytest.raises(Stop):
        first.label(round_dir, candidates, min_labels=0, on_wait=stop_after_two)
    tokens = json.loads((tmp_path / TOKENS_FILE).read_text())
    port = first.server.port
    first.close()
    logged = [r.getMessage() for r in caplog.records]  # what the person running iterate is shown
    assert f"  alice: http://127.0.0.1:{port}/a/{tokens['alice']}" in logged
    assert f"  bob: http://127.0.0.1:{port}/a/{tokens['bob']}" in logged
    assert "round-1: 6 pairs to label on the page (0 labelled so far)" in logged

    # the restart: the same store, the two labels and both links kept; bob labels the rest
    again = HumanJudge(tmp_path, ["alice", "bob"], 1, "127.0.0.1", 0, poll=0.01)
    waits = []
    prefs = again.label(round_dir, candidates, 0, on_wait=lambda store: waits.append(label_some(db, "bob", 6)))
    again.close()
    assert json.loads((tmp_path / TOKENS_FILE).read_text()) == tokens
    assert waits == [4]  # the round did not close until the four open pairs were labelled
    assert len(prefs) == 6 and all("thanks" in r["chosen"] and "thanks" not in r["rejected"] for r in prefs)
    exported = read_jsonl(round_dir / "labels" / "prefs.jsonl")
    assert sorted(r["annotator"] for r in exported) == ["alice"] * 2 + ["bob"] * 4


def test_a_round_closes_at_min_labels_or_when_everyone_skipped_the_rest(tmp_path):
    round_dir = tmp_path / "round-1"
    round_dir.mkdir()
    candidates = write_jsonl(tmp_path / "to_label.jsonl", candidate_rows(4))
    judge = HumanJudge(tmp_path, ["alice", "bob"], 1, "127.0.0.1", 0, poll=0.01)
    store = judge.open_round(candidates, round_dir / "labels")
    db = round_dir / "labels" / "labels.sqlite"
    names = list(judge.tokens)
    label_some(db, "alice", 2)
    assert round_finished(store, names, min_labels=2) and not round_finished(store, names, min_labels=3)
    assert not round_finished(store, names, min_labels=0)
    label_some(db, "alice", 2, choice=lambda a, b: "skip")  # alice skips the last two: bob may still label them
    assert not round_finished(store, names, 0)
    label_some(db, "bob", 2, choice=lambda a, b: "skip")
    assert round_finished(store, names, 0)  # skipped by everyone
    store.close()


def test_the_loop_waits_for_people_labelling_over_http(iterate_task, tmp_path):
    out, port = tmp_path / "out", free_port()
    answered = []

    def annotator():
        client = round_one_client(out, port, "alice")
        if client is None:
            return
        while (item := client.state()["item"]) is not None:
            a, b = "thanks" in item["a"], "thanks" in item["b"]
            choice = "a" if a and not b else "b" if b and not a else "tie"
            status, _ = client.judge(choice, item["id"])
            assert status == 200
            answered.append(choice)

    thread = threading.Thread(target=annotator, daemon=True)
    thread.start()
    t = iterate_task
    result = rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out), judge="human", rounds=1,
        annotators="alice", port=port, poll_seconds=0.1, **{**SMALL, "pairs_per_round": 8},
    )  # fmt: skip
    thread.join(timeout=10)
    pairs = read_jsonl(out / "round-1" / "pairs.jsonl")
    assert len(answered) == len(read_jsonl(out / "round-1" / "to_label.jsonl")) > 0
    assert len(pairs) == sum(c != "tie" for c in answered)
    assert all("thanks" in r["chosen"] and "thanks" not in r["rejected"] for r in pairs)
    assert (out / "round-1" / "labels" / "agreement.json").is_file()
    assert result.metrics["rounds"][0]["labels"] == len(pairs)
    assert (out / "final" / "model.safetensors").is_file()


@pytest.mark.usefixtures("browser")
def test_a_person_labels_a_round_in_a_browser(browser, tmp_path):
    from tests.labelling.test_browser import by_testid, open_page, press, shown, wait_progress, wait_until

    round_dir = tmp_path / "round-1"
    round_dir.mkdir()
    candidates = write_jsonl(tmp_path / "to_label.jsonl", candidate_rows(4))
    judge = HumanJudge(tmp_path, ["alice"], 1, "127.0.0.1", 0, poll=0.05)
    result = {}
    thread = threading.Thread(target=lambda: result.update(prefs=judge.label(round_dir, candidates, 0)), daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while judge.server is None and time.time() < deadline:
            time.sleep(0.05)
        open_page(browser, judge.server.url(f"/a/{judge.tokens['alice']}"))
        for done in range(4):
            wait_progress(browser, done, 4)
            _, a, _ = shown(browser)
            press(browser, "1" if "thanks" in a else "2")
        wait_until(browser, lambda d: by_testid(d, "done").is_displayed())
        thread.join(timeout=30)
    finally:
        judge.close()
    prefs = result["prefs"]
    assert len(prefs) == 4 and all("thanks" in r["chosen"] and "thanks" not in r["rejected"] for r in prefs)
