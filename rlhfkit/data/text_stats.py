"""Statistics of generated text that reveal reward hacking: length drift, repetition, lost diversity."""

from __future__ import annotations


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(texts: list[str], n: int) -> float:
    """Unique n-grams / all n-grams over every text (Li et al. 2016); 0 when there are none."""
    grams = [g for t in texts for g in _ngrams(t.split(), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(text: str, n: int = 2) -> float:
    """Fraction of a text's word n-grams that repeat an earlier n-gram of the same text."""
    grams = _ngrams(text.split(), n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def text_stats(texts: list[str]) -> dict[str, float]:
    """``length`` (words), ``distinct_1``, ``distinct_2``, ``repetition`` (mean within-text bigram repeats)."""
    if not texts:
        return {"length": 0.0, "distinct_1": 0.0, "distinct_2": 0.0, "repetition": 0.0}
    return {
        "length": sum(len(t.split()) for t in texts) / len(texts),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "repetition": sum(repetition_rate(t) for t in texts) / len(texts),
    }
