"""Which pairs each annotator may still be given, kept up to date answer by answer.

A pair is open to an annotator when they have no live answer to it and its load is under labels-per-item,
its load being its live answers that count (skips do not) plus the fresh leases (pairs on screens, see
``store.LEASE_SECONDS``) of other people. ``OpenPairs`` is built once from the store's tables and then told each
change the store commits, so that finding an annotator's next pair and counting what is left to them costs
about the same with a hundred stored answers as with a hundred thousand:

- ``load[item]`` counts every fresh lease, the annotator's own included: a pair at labels-per-item is *full*.
  The number of full pairs, and per annotator the number of full pairs among their answers, are counted as
  loads cross labels-per-item, so what is left to an annotator is an arithmetic of counters (``remaining``).
- Each annotator walks their order with a cursor: every pair before it was closed to them when passed. A pair
  behind someone's cursor that may have opened again (its load fell: a skip, an undo, a lease that expired;
  or their own answer was withdrawn) goes into their ``behind`` heap of positions, looked at first.
- Leases expire by the clock: ``expire(now)`` takes them off the loads in the order they expire.
"""

from __future__ import annotations

import heapq
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class Lease:
    item: int
    shown_at: float
    counted: bool  # still fresh: part of its pair's load


@dataclass
class Walk:
    """One annotator's way through their order."""

    order: list[int]
    position: array  # position[item]: where the pair is in ``order``
    cursor: int = 0  # every pair before it was closed to this annotator when the cursor passed it
    behind: list[int] = field(default_factory=list)  # heap of positions before the cursor that may be open again


class OpenPairs:
    """The loads, answers, leases and walks of one store's pairs (see the module docstring)."""

    def __init__(
        self,
        item_ids: list[int],
        labels_per_item: int,
        order: Callable[[str], list[int]],
        lease_seconds: float,
    ):
        self.k = labels_per_item
        self.n = len(item_ids)
        self.lease_seconds = lease_seconds
        self._order = order
        self.load = array("i", [0]) * (max(item_ids, default=0) + 1)  # indexed by item id
        self.mine: dict[str, set[int]] = {}  # each annotator's live answers (skips included)
        self.full = 0  # pairs whose load is at least labels-per-item
        self.full_mine: Counter[str] = Counter()  # per annotator: full pairs among their answers
        self.leases: dict[str, Lease] = {}  # the pair on each annotator's screen
        self.expiries: list[tuple[float, str, int, float]] = []  # heap of (expires at, annotator, item, shown at)
        self.walks: dict[str, Walk] = {}

    @classmethod
    def build(
        cls,
        item_ids: list[int],
        labels_per_item: int,
        order: Callable[[str], list[int]],
        lease_seconds: float,
        answers: Iterable[tuple[str, int, str]],
        screens: Iterable[tuple[str, int, float]],
        now: float,
    ) -> OpenPairs:
        """From the live answers (annotator, item, choice) and the pairs on screen (annotator, item, shown at)."""
        pairs = cls(item_ids, labels_per_item, order, lease_seconds)
        for annotator, item, choice in answers:
            pairs._mine(annotator).add(item)
            pairs.load[item] += choice != "skip"
        for annotator, item, shown_at in screens:
            pairs.load[item] += pairs._lease(annotator, item, shown_at, now).counted
        pairs.full = sum(load >= pairs.k for load in pairs.load)
        for annotator, items in pairs.mine.items():
            pairs.full_mine[annotator] = sum(pairs.load[i] >= pairs.k for i in items)
        return pairs

    # -- the changes the store commits ---------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Take the leases shown ``lease_seconds`` or more before ``now`` off their pairs' loads."""
        while self.expiries and self.expiries[0][0] <= now:
            _, annotator, item, shown_at = heapq.heappop(self.expiries)
            lease = self.leases.get(annotator)
            if lease is not None and lease.counted and (lease.item, lease.shown_at) == (item, shown_at):
                lease.counted = False
                self._add(item, -1)

    def shown(self, annotator: str, item: int, now: float) -> None:
        """``item`` is on ``annotator``'s screen from ``now``: a lease (the annotator had none)."""
        self._add(item, int(self._lease(annotator, item, now, now).counted))

    def answered(self, annotator: str, item: int, choice: str) -> None:
        """``annotator`` answered ``item``, the pair on their screen (whose lease ends)."""
        lease = self.leases.pop(annotator, None)
        mine = self._mine(annotator)
        if item not in mine:
            mine.add(item)
            self.full_mine[annotator] += self.load[item] >= self.k
        self._add(item, int(choice != "skip") - (lease is not None and lease.counted))

    def withdrawn(self, annotator: str, item: int, choice: str, now: float) -> None:
        """``annotator``'s answer to ``item`` was undone: the pair is back on their screen from ``now``, in place
        of the one there (which is left open to them again: its answer was withdrawn before)."""
        previous = self.leases.pop(annotator, None)
        if previous is not None and previous.counted:
            self._add(previous.item, -1)
        mine = self._mine(annotator)
        if item in mine:
            mine.discard(item)
            self.full_mine[annotator] -= self.load[item] >= self.k
            self._reopened(item)
        self._add(item, int(self._lease(annotator, item, now, now).counted) - (choice != "skip"))

    # -- what an annotator is given ------------------------------------------------------------------------

    def done(self, annotator: str) -> int:
        return len(self.mine.get(annotator, ()))

    def is_open(self, annotator: str, item: int) -> bool:
        """Open to an annotator who has no pair on screen (so no lease of theirs is in the load)."""
        return self.load[item] < self.k and item not in self.mine.get(annotator, ())

    def walk(self, annotator: str) -> Walk:
        """The annotator's walk, made (their order, its positions) the first time."""
        walk = self.walks.get(annotator)
        if walk is None:
            order = self._order(annotator)
            position = array("i", [0]) * len(self.load)
            for p, item in enumerate(order):
                position[item] = p
            walk = self.walks[annotator] = Walk(order, position)
        return walk

    def next_for(self, annotator: str) -> int | None:
        """The first pair of ``annotator``'s order open to them (who has none on screen), or None."""
        walk = self.walk(annotator)
        while walk.behind:
            item = walk.order[walk.behind[0]]
            if self.is_open(annotator, item):
                return item
            heapq.heappop(walk.behind)
        while walk.cursor < len(walk.order):
            item = walk.order[walk.cursor]
            if self.is_open(annotator, item):
                return item
            walk.cursor += 1
        return None

    def remaining(self, annotator: str, current: int | None) -> int:
        """The pairs still open to ``annotator``, the one on their screen (``current``) counted once: the
        counters give the pairs neither answered by them nor full; the pair on their screen, the only one whose
        load may hold their own lease, is counted whatever its load."""
        mine = self.mine.get(annotator, set())
        unanswered_not_full = self.n - len(mine) - (self.full - self.full_mine[annotator])
        if current is None:
            return unanswered_not_full
        return unanswered_not_full + 1 - (current not in mine and self.load[current] < self.k)

    # -- bookkeeping ---------------------------------------------------------------------------------------

    def _mine(self, annotator: str) -> set[int]:
        return self.mine.setdefault(annotator, set())

    def _lease(self, annotator: str, item: int, shown_at: float, now: float) -> Lease:
        """Record the lease (the caller adds it to the load when it is counted) and when it expires."""
        expires = shown_at + self.lease_seconds
        lease = self.leases[annotator] = Lease(item, shown_at, counted=expires > now)
        if lease.counted:
            heapq.heappush(self.expiries, (expires, annotator, item, shown_at))
        return lease

    def _add(self, item: int, delta: int) -> None:
        """Change ``item``'s load by ``delta``, keeping the counts of full pairs, and telling the walks that
        passed it when it falls."""
        if delta == 0:
            return
        before = self.load[item]
        self.load[item] = before + delta
        was_full, is_full = before >= self.k, before + delta >= self.k
        if was_full != is_full:
            step = 1 if is_full else -1
            self.full += step
            for annotator, items in self.mine.items():
                if item in items:
                    self.full_mine[annotator] += step
        if delta < 0:
            self._reopened(item)

    def _reopened(self, item: int) -> None:
        for walk in self.walks.values():
            p = walk.position[item]
            if p < walk.cursor:
                heapq.heappush(walk.behind, p)
