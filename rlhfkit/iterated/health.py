"""What tells that the loop is walking into collapse, measured on a round's replies.

A policy that has collapsed onto one reply (or a few) gives pairs whose two replies are the same or nearly so:
the judge's labels on them are coin flips, and the reward model trained on them learns nothing, or noise. The
share of such pairs shows it before the labels are spent. (The share of distinct replies over the prompts is
recorded too, but is no test: a task whose good replies are few narrows it legitimately.)
"""

from __future__ import annotations

from difflib import SequenceMatcher

NEAR_IDENTICAL = 0.9  # word-sequence similarity from which two replies count as the same reply


def distinct_share(replies: list[str]) -> float:
    """Distinct replies over replies (1.0: every reply differs; 1 / n: one reply everywhere); 0 for none."""
    return len(set(replies)) / len(replies) if replies else 0.0


def similarity(a: str, b: str) -> float:
    """How alike two replies are, word by word, in [0, 1] (1: the same words in the same order)."""
    return SequenceMatcher(None, a.split(), b.split(), autojunk=False).ratio()


def similar_share(pairs: list[tuple[str, str]]) -> float:
    """Share of pairs whose two replies are identical or near-identical (similarity >= NEAR_IDENTICAL)."""
    if not pairs:
        return 0.0
    return sum(similarity(a, b) >= NEAR_IDENTICAL for a, b in pairs) / len(pairs)


def collapsed(similar: float, baseline: float, threshold: float) -> bool:
    """Whether a policy whose share of near-identical pairs is ``similar`` has collapsed: at least ``threshold``
    and above the starting policy's ``baseline`` (``threshold`` 0: never)."""
    return threshold > 0 and similar >= threshold and similar > baseline
