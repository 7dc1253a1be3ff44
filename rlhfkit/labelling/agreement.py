"""How much annotators agree, and how much the screen side sways them. Pure Python, no I/O.

Labels here are outcomes in a pair's own terms ("x", "y", "tie", "both_bad"), so two people who saw the
pair in opposite screen orders but preferred the same response agree.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter


def cohen_kappa(first: list[str], second: list[str]) -> float | None:
    """Cohen's kappa of two raters over the same items: (p_o - p_e) / (1 - p_e), with p_o the observed
    agreement and p_e = sum_c p1(c) p2(c) the agreement expected from each rater's own label frequencies
    (Cohen 1960). None when p_e = 1 (both raters always gave the same single label: kappa is undefined)."""
    if len(first) != len(second) or not first:
        raise ValueError("cohen_kappa: need two equally long, non-empty label lists")
    n = len(first)
    observed = sum(a == b for a, b in zip(first, second)) / n
    c1, c2 = Counter(first), Counter(second)
    expected = sum(c1[c] * c2[c] for c in c1) / (n * n)
    if expected == 1:
        return None
    return (observed - expected) / (1 - expected)


def fleiss_kappa(items: list[Counter]) -> float | None:
    """Fleiss' kappa over items each rated by n_i >= 2 raters (n_i may differ between items):

        P_i = (sum_c n_ic^2 - n_i) / (n_i (n_i - 1))     agreement among item i's rater pairs
        p_c = sum_i n_ic / sum_i n_i                       overall share of label c
        kappa = (mean_i P_i - sum_c p_c^2) / (1 - sum_c p_c^2)

    (Fleiss 1971; with equal n_i this is his formula.) Items with fewer than two ratings are left out.
    None when no item has two ratings or every rating is the same label."""
    rated = [c for c in items if sum(c.values()) >= 2]
    if not rated:
        return None
    p_items = []
    totals: Counter = Counter()
    for counts in rated:
        n = sum(counts.values())
        p_items.append((sum(v * v for v in counts.values()) - n) / (n * (n - 1)))
        totals.update(counts)
    all_ratings = sum(totals.values())
    expected = sum((v / all_ratings) ** 2 for v in totals.values())
    if expected == 1:
        return None
    return (sum(p_items) / len(p_items) - expected) / (1 - expected)


def pair_agreement(labels: list[str]) -> float | None:
    """Share of an item's rater pairs that gave the same label (None with fewer than two labels)."""
    if len(labels) < 2:
        return None
    pairs = list(itertools.combinations(labels, 2))
    return sum(a == b for a, b in pairs) / len(pairs)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion (None for n = 0): the spread to expect of the left-win
    rate from chance alone, so 0.55 over 20 judgments is not read as a position bias."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
