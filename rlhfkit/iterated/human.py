"""People as the judge of `rlhfkit iterate --judge human`: each round's pairs on the labelling page.

Round K's pairs are written to ``OUT/round-K/candidates.jsonl`` and become the label store
``OUT/round-K/labels/labels.sqlite`` (the store of `rlhfkit label`: every answer is on disk before the page
confirms it). One page serves the whole run: each annotator keeps one private URL for every round (the tokens
are kept in ``OUT/annotators.json``), and the page shows the current round's pairs. The round waits, polling
the store, until every pair has its labels (or was skipped by everyone), or until ``--min-labels`` pairs are
labelled; then the labels are exported (`rlhfkit label --export`'s ``prefs.jsonl``, ``ties.jsonl`` and
``agreement.json`` in the round's ``labels/``). A run stopped while it waits is continued with ``--resume``:
the round reopens its store, with every label given so far.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path

from rlhfkit.config.pages import LabelArgs, LabelConfig
from rlhfkit.errors import UserError, option
from rlhfkit.labelling.app import DEFAULT_ANNOTATOR, LabelApp, open_store
from rlhfkit.labelling.export import export
from rlhfkit.labelling.store import Store
from rlhfkit.web.server import Server, is_loopback

logger = logging.getLogger(__name__)

TOKENS_FILE = "annotators.json"


def round_finished(store: Store, annotators: list[str], min_labels: int) -> bool:
    """Whether a round's labelling is over: ``min_labels`` (> 0) pairs have their labels, or every pair either
    has its labels-per-item answers (skips not counted) or was answered (skipped included) by every annotator."""
    k, items = store.labels_per_item, store.items()
    labels: dict[int, int] = defaultdict(int)
    seen: dict[int, set[str]] = defaultdict(set)
    for j in store.judgments():
        seen[j.item_id].add(j.annotator)
        labels[j.item_id] += j.choice != "skip"
    complete = sum(labels[i] >= k for i in items)
    if min_labels and complete >= min_labels:
        return True
    everyone = set(annotators)
    return all(labels[i] >= k or everyone <= seen[i] for i in items)


class HumanJudge:
    """The labelling page of a run, and the rounds' stores behind it."""

    def __init__(
        self,
        out: Path,
        names: list[str],
        labels_per_item: int,
        host: str,
        port: int,
        poll: float,
        guidelines: str = "",
    ):
        self.out, self.labels_per_item, self.poll, self.guidelines = out, labels_per_item, poll, guidelines
        self.names = names or [DEFAULT_ANNOTATOR]
        if not is_loopback(host) and self.names == [DEFAULT_ANNOTATOR]:
            raise UserError(
                f"{option('host', host)} makes the page reachable from other machines: name the annotators "
                f"({option('annotators', 'a,b')}) so that each gets a private link"
            )
        self.host, self.port = host, port
        self.tokens: dict[str, str] = {}
        path = out / TOKENS_FILE
        if path.is_file():
            self.tokens = json.loads(path.read_text(encoding="utf-8"))
        self.app: LabelApp | None = None
        self.server: Server | None = None

    def open_round(self, candidates: Path, labels_dir: Path) -> Store:
        """The round's store (created from ``candidates`` the first time, reopened with its labels after)."""
        cfg = LabelConfig(label=LabelArgs(data=str(candidates), output_dir=str(labels_dir)))
        cfg.label.labels_per_item = self.labels_per_item
        store = open_store(cfg)
        self.tokens = store.add_annotators(self.names, self.tokens)
        tmp = self.out / (TOKENS_FILE + ".tmp")
        tmp.write_text(json.dumps(self.tokens, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.out / TOKENS_FILE)
        return store

    def _serve(self, store: Store) -> None:
        if self.app is None:
            self.app = LabelApp(store, self.guidelines)
            self.server = Server(self.app.app, self.host, self.port).start()
            for name in self.names:
                logger.info("  %s: %s", name, self.server.url(f"/a/{self.tokens[name]}"))
        previous, self.app.store = self.app.store, store
        if previous is not store:  # the page now reads the new round's store; the last one is done
            previous.close()

    def label(self, round_dir: Path, candidates: Path, min_labels: int, on_wait=None) -> list[dict]:
        """Serve round ``round_dir``'s pairs until labelled; returns the exported preference rows."""
        labels_dir = round_dir / "labels"
        store = self.open_round(candidates, labels_dir)
        self._serve(store)  # the page keeps showing this round (all done) until the next one opens
        logger.info(
            "%s: %d pairs to label on the page (%d labelled so far)",
            round_dir.name,
            store.item_count(),
            store.complete_items(),
        )
        while not round_finished(store, list(self.tokens), min_labels):
            if on_wait is not None:
                on_wait(store)
            time.sleep(self.poll)
        aggregate = "majority" if store.labels_per_item > 1 else "none"
        paths = export(store, labels_dir, LabelConfig().margins(), aggregate)
        rows = [json.loads(line) for line in paths["prefs.jsonl"].read_text(encoding="utf-8").splitlines() if line]
        return [{k: r[k] for k in ("prompt", "chosen", "rejected", "margin") if k in r} for r in rows]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.app is not None:
            self.app.store.close()
            self.app = None
