"""The label store: one SQLite file (WAL journal, full sync), ``OUT/labels.sqlite``.

Tables:
    meta(key, value)                       data file hash, seed, labels per item, the CSRF secret
    items(id, prompt, x, y, source, ...)   the pairs; texts as JSON (a string or a list of messages)
    annotators(name, token)                the secret in each annotator's URL
    current(annotator, item_id, left, shown_at)
                                           the pair each annotator has on screen (a lease: while it is
                                           fresh, nobody else is sent the same pair beyond labels-per-item)
    judgments(id, request_id, annotator, item_id, left, choice, strength, comment, shown_at, answered_at,
              undone_at)                   one row per answer; undo marks it, never deletes it
    undos(request_id, judgment_id)         undo requests already carried out

Every change is one ``BEGIN IMMEDIATE`` transaction under a process-wide lock, and returns only after the
commit: with ``synchronous=FULL`` the commit is on disk, so an acknowledged judgment survives a crash.
A request id (made by the page, unique per click) is stored with its judgment; the same request sent again
(a double click, a retry after a lost response) finds it and changes nothing.

Fairness: each annotator walks the pairs in their own random order, and sees each pair's two responses in
an order drawn for that annotator and pair (``left``, stored with the answer), so neither item order nor
screen side is shared between people.

Which pairs are still open to whom lives in memory (``open_pairs.OpenPairs``): built from the tables on first
use, then told every change this store commits, so that a page load or an answer costs the same
however many answers are stored. Another connection's commit (SQLite's ``data_version``) has it built again.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.errors import UserError, option
from rlhfkit.labelling.items import Pair
from rlhfkit.labelling.open_pairs import OpenPairs

CHOICES = ("a", "b", "tie", "both_bad", "skip")
LEASE_SECONDS = 30 * 60  # a pair on someone's screen is kept from others this long
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY, prompt TEXT NOT NULL, x TEXT NOT NULL, y TEXT NOT NULL, source TEXT NOT NULL,
    x_index INTEGER NOT NULL, y_index INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS annotators (name TEXT PRIMARY KEY, token TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS current (
    annotator TEXT PRIMARY KEY, item_id INTEGER NOT NULL, left TEXT NOT NULL, shown_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS judgments (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, annotator TEXT NOT NULL,
    item_id INTEGER NOT NULL REFERENCES items(id), left TEXT NOT NULL CHECK (left IN ('x', 'y')),
    choice TEXT NOT NULL CHECK (choice IN ('a', 'b', 'tie', 'both_bad', 'skip')),
    strength TEXT, comment TEXT, shown_at REAL NOT NULL, answered_at REAL NOT NULL, undone_at REAL);
CREATE UNIQUE INDEX IF NOT EXISTS one_live_answer ON judgments(annotator, item_id) WHERE undone_at IS NULL;
CREATE INDEX IF NOT EXISTS live_answers_in_order ON judgments(annotator, id) WHERE undone_at IS NULL;
CREATE TABLE IF NOT EXISTS undos (request_id TEXT PRIMARY KEY, judgment_id INTEGER NOT NULL);
"""


class Conflict(Exception):
    """A request that cannot apply to the annotator's state (a stale page, nothing to undo)."""


@dataclass(frozen=True)
class Judgment:
    id: int
    request_id: str
    annotator: str
    item_id: int
    left: str  # "x" or "y": which of the pair's responses was shown on the left, as A
    choice: str  # one of CHOICES, as shown: "a" is the left response
    strength: str | None
    comment: str | None
    shown_at: float
    answered_at: float

    @property
    def winner(self) -> str | None:
        """The better response in the pair's own terms ("x" or "y"), or None for tie / both bad / skip."""
        if self.choice not in ("a", "b"):
            return None
        right = "y" if self.left == "x" else "x"
        return self.left if self.choice == "a" else right

    @property
    def outcome(self) -> str:
        """ "x", "y", "tie", "both_bad" or "skip", independent of the screen side."""
        return self.winner or self.choice


@dataclass(frozen=True)
class Shown:
    """The pair an annotator has on screen, in screen order."""

    item_id: int
    left: str
    prompt: object
    a: object
    b: object


def file_digest(path: str | Path) -> str:
    p = Path(path)
    digest = hashlib.sha256()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.RLock()  # reads take it too: one connection, shared by the server's threads
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._seed: int | None = None
        self._item_ids: list[int] | None = None
        self._orders: dict[str, list[int]] = {}
        self._open: OpenPairs | None = None  # built on first use (see the module docstring)
        self._open_version: int | None = None  # the data_version it was built at
        self.clock = time.time  # what leases are timed by

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction. ``durable=False`` commits without waiting for the disk, for what a crash may
        lose harmlessly (which pair is on whose screen: it is drawn again, the same one); the next durable
        commit syncs the journal with it, so nothing is ever stored out of order."""
        with self._lock:
            if not durable:
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            finally:
                if not durable:
                    self._db.execute("PRAGMA synchronous=FULL")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- set-up ------------------------------------------------------------------------------------------

    def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def meta(self, key: str) -> str | None:
        row = next(iter(self._read("SELECT value FROM meta WHERE key = ?", (key,))), None)
        return None if row is None else row["value"]

    def initialise(self, pairs: list[Pair] | None, digest: str | None, seed: int, labels_per_item: int) -> None:
        """Fill a new store with ``pairs``, or check that an existing one holds the same file's pairs.
        ``labels_per_item`` 0 keeps the stored number (1 for a new store)."""
        with self.transaction() as db:
            stored = self.meta("data_sha256")
            if stored is None:
                if pairs is None:
                    raise UserError(
                        f"{self.path.parent}: no labels here yet; give {option('data')} (the candidates to label)"
                    )
                db.executemany(
                    "INSERT INTO items (prompt, x, y, source, x_index, y_index) VALUES (?, ?, ?, ?, ?, ?)",
                    [(_dump(p.prompt), _dump(p.x), _dump(p.y), p.source, p.x_index, p.y_index) for p in pairs],
                )
                for key, value in (
                    ("data_sha256", digest),
                    ("seed", seed),
                    ("csrf_secret", secrets.token_hex(32)),
                    ("created_at", time.time()),
                ):
                    db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, str(value)))
            elif digest is not None and digest != stored:
                raise UserError(
                    f"{self.path.parent}: holds the labels of another candidates file; keep {option('data')} as it "
                    f"was, leave it out to continue, or use a new {option('output_dir')}"
                )
            if labels_per_item > 0 or self.meta("labels_per_item") is None:  # 0: keep the stored number
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('labels_per_item', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (str(max(labels_per_item, 1)),),
                )
            # a new store's pairs and seed, or another labels-per-item
            self._seed, self._item_ids, self._orders, self._open = None, None, {}, None

    def add_annotators(self, names: list[str], tokens: dict[str, str] | None = None) -> dict[str, str]:
        """Give each new name a token (from ``tokens`` where it names one, to keep a link from another store);
        returns every annotator's {name: token} (old ones keep theirs)."""
        tokens = tokens or {}
        with self.transaction() as db:
            for name in names:
                db.execute(
                    "INSERT INTO annotators (name, token) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                    (name, tokens.get(name) or secrets.token_urlsafe(18)),
                )
            return {r["name"]: r["token"] for r in db.execute("SELECT name, token FROM annotators ORDER BY rowid")}

    def annotator_for(self, token: str) -> str | None:
        for row in self._read("SELECT name, token FROM annotators"):
            if secrets.compare_digest(row["token"], token):
                return row["name"]
        return None

    @property
    def labels_per_item(self) -> int:
        return int(self.meta("labels_per_item") or 1)

    @property
    def seed(self) -> int:
        if self._seed is None:  # set when the store is made, never changed
            self._seed = int(self.meta("seed") or 0)
        return self._seed

    def item_count(self) -> int:
        return self._read("SELECT COUNT(*) FROM items")[0][0]

    # -- what each annotator sees --------------------------------------------------------------------------

    def item_ids(self) -> list[int]:
        if self._item_ids is None:
            self._item_ids = [r[0] for r in self._read("SELECT id FROM items ORDER BY id")]
        return self._item_ids

    def order(self, annotator: str) -> list[int]:
        """This annotator's own random order of all pairs (the same after a restart)."""
        if annotator not in self._orders:
            ids = list(self.item_ids())
            random.Random(f"{self.seed}/order/{annotator}").shuffle(ids)
            self._orders[annotator] = ids
        return self._orders[annotator]

    def left_for(self, annotator: str, item_id: int) -> str:
        """Which response this annotator sees on the left for this pair: a fair coin per (annotator, pair)."""
        return "x" if random.Random(f"{self.seed}/side/{annotator}/{item_id}").random() < 0.5 else "y"

    def _open_pairs(self, now: float) -> OpenPairs:
        """Which pairs are open to whom (the caller holds the lock): built from the tables the first time and
        after another connection committed, with the leases older than ``now - LEASE_SECONDS`` expired."""
        version = self._db.execute("PRAGMA data_version").fetchone()[0]
        if self._open is None or version != self._open_version:
            self._open = OpenPairs.build(
                self.item_ids(),
                self.labels_per_item,
                self.order,
                LEASE_SECONDS,
                self._db.execute("SELECT annotator, item_id, choice FROM judgments WHERE undone_at IS NULL"),
                self._db.execute("SELECT annotator, item_id, shown_at FROM current"),
                now,
            )
            self._open_version = version
        self._open.expire(now)
        return self._open

    def prepare(self, annotators: list[str]) -> None:
        """Build the open pairs and these annotators' orders now, and walk each past the pairs closed to them
        (time in the number of pairs and answers), so that their first page load is as quick as the others."""
        with self._lock:
            open_pairs = self._open_pairs(self.clock())
            for annotator in annotators:
                open_pairs.next_for(annotator)

    def _tell(self, change: Callable, *args) -> None:
        """Tell the open pairs a change just committed; should that fail, they are built again on next use."""
        try:
            change(*args)
        except BaseException:
            self._open = None
            raise

    def state(self, annotator: str) -> dict:
        """The annotator's pair on screen (drawing the next one when they have none) and their progress."""
        now = self.clock()
        with self._lock:
            open_pairs = self._open_pairs(now)
            with self.transaction(durable=False) as db:
                cur = db.execute("SELECT item_id, left FROM current WHERE annotator = ?", (annotator,)).fetchone()
                drawn = open_pairs.next_for(annotator) if cur is None else None
                if drawn is not None:
                    cur = {"item_id": drawn, "left": self.left_for(annotator, drawn)}
                    db.execute(
                        "INSERT INTO current (annotator, item_id, left, shown_at) VALUES (?, ?, ?, ?)",
                        (annotator, drawn, cur["left"], now),
                    )
                shown = None if cur is None else self._shown(db, cur["item_id"], cur["left"])
            if drawn is not None:
                self._tell(open_pairs.shown, annotator, drawn, now)
            done = open_pairs.done(annotator)
            remaining = open_pairs.remaining(annotator, None if cur is None else cur["item_id"])
        return {"item": shown, "progress": {"done": done, "total": done + remaining}, "can_undo": done > 0}

    def _shown(self, db: sqlite3.Connection, item_id: int, left: str) -> Shown:
        row = db.execute("SELECT prompt, x, y FROM items WHERE id = ?", (item_id,)).fetchone()
        x, y = json.loads(row["x"]), json.loads(row["y"])
        a, b = (x, y) if left == "x" else (y, x)
        return Shown(item_id, left, json.loads(row["prompt"]), a, b)

    # -- answers -------------------------------------------------------------------------------------------

    def judge(
        self,
        annotator: str,
        request_id: str,
        item_id: int,
        choice: str,
        strength: str | None = None,
        comment: str | None = None,
    ) -> tuple[int, bool]:
        """Store one answer; returns (judgment id, whether this request was new). Durable when it returns."""
        if choice not in CHOICES:
            raise ValueError(f"unknown choice {choice!r}")
        now = self.clock()
        with self._lock:
            open_pairs = self._open_pairs(now)
            with self.transaction() as db:
                seen = db.execute("SELECT id, annotator FROM judgments WHERE request_id = ?", (request_id,)).fetchone()
                if seen is not None:
                    if seen["annotator"] != annotator:
                        raise Conflict("this request id belongs to another annotator")
                    return seen["id"], False
                cur = db.execute(
                    "SELECT item_id, left, shown_at FROM current WHERE annotator = ?", (annotator,)
                ).fetchone()
                if cur is None or cur["item_id"] != item_id:
                    raise Conflict("this pair is no longer the one on your screen; the page shows the current one")
                answer = (request_id, annotator, item_id, cur["left"], choice, strength, comment or None)
                judgment_id = db.execute(
                    "INSERT INTO judgments (request_id, annotator, item_id, left, choice, strength, comment, "
                    "shown_at, answered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*answer, cur["shown_at"], now),
                ).lastrowid
                db.execute("DELETE FROM current WHERE annotator = ?", (annotator,))
            self._tell(open_pairs.answered, annotator, item_id, choice)
        return judgment_id, True

    def undo(self, annotator: str, request_id: str) -> bool:
        """Withdraw the annotator's latest live answer and put its pair back on their screen (same sides).
        Returns whether this request was new; raises Conflict when there is nothing to undo."""
        now = self.clock()
        with self._lock:
            open_pairs = self._open_pairs(now)
            with self.transaction() as db:
                if db.execute("SELECT 1 FROM undos WHERE request_id = ?", (request_id,)).fetchone():
                    return False
                last = db.execute(
                    "SELECT id, item_id, left, choice FROM judgments WHERE annotator = ? AND undone_at IS NULL "
                    "ORDER BY id DESC LIMIT 1",
                    (annotator,),
                ).fetchone()
                if last is None:
                    raise Conflict("nothing to undo")
                db.execute("UPDATE judgments SET undone_at = ? WHERE id = ?", (now, last["id"]))
                db.execute(
                    "INSERT INTO current (annotator, item_id, left, shown_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(annotator) DO UPDATE SET item_id = excluded.item_id, left = excluded.left, "
                    "shown_at = excluded.shown_at",
                    (annotator, last["item_id"], last["left"], now),
                )
                db.execute("INSERT INTO undos (request_id, judgment_id) VALUES (?, ?)", (request_id, last["id"]))
            self._tell(open_pairs.withdrawn, annotator, last["item_id"], last["choice"], now)
        return True

    # -- reading everything back ---------------------------------------------------------------------------

    def judgments(self, include_undone: bool = False) -> list[Judgment]:
        where = "" if include_undone else "WHERE undone_at IS NULL"
        rows = self._read(
            "SELECT id, request_id, annotator, item_id, left, choice, strength, comment, shown_at, answered_at "
            f"FROM judgments {where} ORDER BY id"
        )
        return [Judgment(**dict(r)) for r in rows]

    def items(self) -> dict[int, Pair]:
        rows = self._read("SELECT id, prompt, x, y, source, x_index, y_index FROM items ORDER BY id")
        return {
            r["id"]: Pair(
                json.loads(r["prompt"]), json.loads(r["x"]), json.loads(r["y"]), r["source"], r["x_index"], r["y_index"]
            )
            for r in rows
        }

    def complete_items(self) -> int:
        """Pairs with labels-per-item answers (skips not counted)."""
        return self._read(
            "SELECT COUNT(*) FROM (SELECT item_id FROM judgments WHERE undone_at IS NULL AND choice != 'skip' "
            "GROUP BY item_id HAVING COUNT(*) >= ?)",
            (self.labels_per_item,),
        )[0][0]


def _dump(text) -> str:
    return json.dumps(text, ensure_ascii=False)
