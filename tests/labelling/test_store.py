"""The label store: fair item order and sides, labels per item, idempotent answers, undo, restarts."""

from __future__ import annotations

import random
import sqlite3
from collections import Counter

import pytest

from rlhfkit.errors import UserError
from rlhfkit.labelling.items import Pair
from rlhfkit.labelling.store import LEASE_SECONDS, Conflict, Store


def pairs(n: int) -> list[Pair]:
    return [Pair(f"prompt {i}", f"x{i}", f"y{i}", f"c.jsonl: line {i + 1}", 0, 1) for i in range(n)]


def new_store(tmp_path, n=20, labels_per_item=1, digest="d1") -> Store:
    store = Store(tmp_path / "labels.sqlite")
    store.initialise(pairs(n), digest, seed=0, labels_per_item=labels_per_item)
    return store


def test_each_annotator_has_their_own_order_and_sides_kept_across_restarts(tmp_path):
    store = new_store(tmp_path, n=200)
    alice, bob = store.order("alice"), store.order("bob")
    assert sorted(alice) == sorted(bob) == list(range(1, 201)) and alice != bob
    sides = [store.left_for("alice", i) for i in alice]
    assert 60 < sides.count("x") < 140  # a fair coin per pair
    assert any(store.left_for("alice", i) != store.left_for("bob", i) for i in alice)
    store.close()
    again = Store(tmp_path / "labels.sqlite")
    assert again.order("alice") == alice and [again.left_for("alice", i) for i in alice] == sides


def test_the_shown_pair_follows_the_order_and_the_stored_side(tmp_path):
    store = new_store(tmp_path)
    state = store.state("alice")
    shown = state["item"]
    assert shown.item_id == store.order("alice")[0]
    expected = (f"x{shown.item_id - 1}", f"y{shown.item_id - 1}")
    assert (shown.a, shown.b) == (expected if shown.left == "x" else expected[::-1])
    assert state["progress"] == {"done": 0, "total": 20}
    assert store.state("alice")["item"] == shown  # a reload shows the same pair


def test_a_resubmitted_request_is_stored_once_and_a_stale_one_refused(tmp_path):
    store = new_store(tmp_path)
    item = store.state("alice")["item"].item_id
    assert store.judge("alice", "req-00001", item, "a", "much")[1] is True
    assert store.judge("alice", "req-00001", item, "a", "much")[1] is False
    assert len(store.judgments()) == 1
    with pytest.raises(Conflict):
        store.judge("alice", "req-00002", item, "b")  # that pair is no longer on alice's screen
    with pytest.raises(Conflict):
        store.judge("bob", "req-00001", item, "a")  # another annotator's request id
    assert store.state("alice")["progress"]["done"] == 1


def test_undo_withdraws_the_last_answer_and_shows_its_pair_again(tmp_path):
    store = new_store(tmp_path)
    first = store.state("alice")["item"]
    store.judge("alice", "req-00001", first.item_id, "a")
    store.state("alice")
    assert store.undo("alice", "undo-0001") is True
    assert store.undo("alice", "undo-0001") is False  # the same click again: nothing more is withdrawn
    again = store.state("alice")["item"]
    assert (again.item_id, again.left) == (first.item_id, first.left)
    assert store.judgments() == [] and len(store.judgments(include_undone=True)) == 1
    store.judge("alice", "req-00002", first.item_id, "b")
    assert [j.choice for j in store.judgments()] == ["b"]
    with pytest.raises(Conflict):
        Store(tmp_path / "labels.sqlite").undo("bob", "undo-0002")  # bob has nothing to undo


def test_labels_per_item_counts_answers_and_open_screens(tmp_path):
    store = new_store(tmp_path, n=1, labels_per_item=2)
    assert store.state("alice")["item"].item_id == 1
    assert store.state("bob")["item"].item_id == 1
    assert store.state("carol")["item"] is None  # two people already have the only pair on screen
    store.judge("alice", "req-a", 1, "a")
    store.judge("bob", "req-b", 1, "skip")  # a skip leaves the pair to someone else
    assert store.state("carol")["item"].item_id == 1
    store.judge("carol", "req-c", 1, "b")
    assert store.complete_items() == 1
    assert store.state("alice")["item"] is None and store.state("alice")["progress"] == {"done": 1, "total": 1}


def test_with_one_label_per_item_two_annotators_never_get_the_same_pair(tmp_path):
    store = new_store(tmp_path, n=30)
    seen = {"alice": [], "bob": []}
    for step in range(15):
        for name in seen:
            item = store.state(name)["item"]
            seen[name].append(item.item_id)
            store.judge(name, f"{name}-{step:04d}", item.item_id, "a")
    assert not set(seen["alice"]) & set(seen["bob"])
    assert store.state("alice")["item"] is None and store.complete_items() == 30


def test_a_restart_continues_and_refuses_another_file(tmp_path):
    store = new_store(tmp_path)
    item = store.state("alice")["item"].item_id
    store.judge("alice", "req-00001", item, "tie")
    on_screen = store.state("alice")["item"]
    store.close()
    again = Store(tmp_path / "labels.sqlite")
    again.initialise(None, None, seed=0, labels_per_item=1)  # no --data: continue
    assert again.state("alice")["item"] == on_screen and again.state("alice")["progress"]["done"] == 1
    with pytest.raises(UserError, match="another candidates file"):
        again.initialise(pairs(3), "other-digest", seed=0, labels_per_item=1)


def test_labels_per_item_is_kept_on_a_restart_unless_given(tmp_path):
    new_store(tmp_path, labels_per_item=3).close()
    again = Store(tmp_path / "labels.sqlite")
    again.initialise(None, None, seed=0, labels_per_item=0)  # a restart or an export without the flag
    assert again.labels_per_item == 3
    again.initialise(None, None, seed=0, labels_per_item=2)
    assert again.labels_per_item == 2


def test_answers_are_committed_with_a_full_sync_in_a_wal_journal(tmp_path):
    store = new_store(tmp_path)
    store.state("alice")  # drawing a pair commits without waiting for the disk, and restores the full sync
    assert store._read("PRAGMA journal_mode")[0][0] == "wal"
    assert store._read("PRAGMA synchronous")[0][0] == 2  # FULL: a commit returns once it is on disk


def scanned(db: sqlite3.Connection, order: list[int], annotator: str, now: float, k: int) -> tuple:
    """The pair ``annotator`` is shown and their progress, found by scanning every answer and every pair: the
    oracle of the store's open-pairs index."""
    mine = {
        i
        for (i,) in db.execute("SELECT item_id FROM judgments WHERE annotator = ? AND undone_at IS NULL", (annotator,))
    }
    load = Counter(
        dict(
            db.execute(
                "SELECT item_id, COUNT(*) FROM judgments WHERE undone_at IS NULL AND choice != 'skip' GROUP BY item_id"
            )
        )
    )
    for (i,) in db.execute(
        "SELECT item_id FROM current WHERE annotator != ? AND shown_at > ?", (annotator, now - LEASE_SECONDS)
    ):
        load[i] += 1
    open_items = [i for i in order if i not in mine and load[i] < k]
    cur = db.execute("SELECT item_id FROM current WHERE annotator = ?", (annotator,)).fetchone()
    item = cur[0] if cur else next(iter(open_items), None)
    remaining = len(open_items) + (item is not None and item not in open_items)
    return item, {"done": len(mine), "total": len(mine) + remaining}


@pytest.mark.parametrize("labels_per_item", [1, 2])
def test_the_open_pairs_index_agrees_with_a_scan_of_every_answer(tmp_path, labels_per_item):
    """Random clicks of three people (answers, skips, undos, stale pages), leases that expire, a restart and a
    second connection writing: each page load shows what a scan of all answers and pairs gives."""
    rng = random.Random(labels_per_item)
    clock = [1000.0]
    stores = [new_store(tmp_path, n=15, labels_per_item=labels_per_item)]
    stores[0].clock = lambda: clock[0]
    db = sqlite3.connect(tmp_path / "labels.sqlite")
    names = ["alice", "bob", "carol"]
    for step in range(700):
        name, store, roll = rng.choice(names), rng.choice(stores), rng.random()
        if roll < 0.1:
            clock[0] += rng.choice([1.0, LEASE_SECONDS / 2, LEASE_SECONDS + 1])
        elif roll < 0.2:
            try:
                store.undo(name, f"undo-{step:05d}")
            except Conflict:
                pass
        elif roll < 0.6:
            item = store.state(name)["item"]
            if item is not None or rng.random() < 0.2:
                choice = rng.choice(["a", "b", "tie", "both_bad", "skip", "skip"])
                try:  # sometimes a pair no longer on screen: refused, nothing changes
                    store.judge(name, f"judge-{step:05d}", item.item_id if item else rng.randint(1, 15), choice)
                except Conflict:
                    pass
        elif roll < 0.61 and len(stores) == 1:  # a second connection to the same file, used from now on too
            stores.append(Store(tmp_path / "labels.sqlite"))
            stores[1].clock = stores[0].clock
        elif roll < 0.62:  # a restart, ready for everyone before the first page load, as `rlhfkit label` starts
            stores[0].close()
            stores[0] = Store(tmp_path / "labels.sqlite")
            stores[0].clock = lambda: clock[0]
            stores[0].prepare(names)
        else:
            want = scanned(db, store.order(name), name, clock[0], labels_per_item)
            state = store.state(name)
            got = None if state["item"] is None else state["item"].item_id
            assert (got, state["progress"]) == want, step
    assert {j.annotator for j in stores[0].judgments()} == set(names)


def test_a_page_load_and_an_answer_cost_sqlite_the_same_however_many_answers_are_stored(tmp_path):
    """SQLite's work for one more label (its page load and its answer), counted in virtual-machine steps, is
    the same beside 100 stored answers as beside 20,000: nothing scans the stored answers."""

    def steps(stored: int) -> int:
        store = Store(tmp_path / f"{stored}.sqlite")
        store.initialise(pairs(2 * stored + 10), "d", seed=0, labels_per_item=1)
        with store.transaction() as db:
            db.executemany(
                "INSERT INTO judgments (request_id, annotator, item_id, left, choice, shown_at, answered_at) "
                "VALUES (?, ?, ?, 'x', 'a', 0, 0)",
                [(f"old-{i:06d}", f"old{i % 5}", 2 * i + 1) for i in range(stored)],
            )
        store.judge("alice", "warm-up-1", store.state("alice")["item"].item_id, "a")  # builds the index, an order
        count = [0]

        def step() -> int:
            count[0] += 1
            return 0  # go on

        store._db.set_progress_handler(step, 1)
        for i in range(10):
            store.judge("alice", f"req-{i:05d}", store.state("alice")["item"].item_id, "b")
        store._db.set_progress_handler(None, 1)
        store.close()
        return count[0]

    few, many = steps(100), steps(20000)
    assert many <= 1.2 * few, (few, many)
