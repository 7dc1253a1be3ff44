"""The facts of the customer-support task: issue categories, products and the
phrases that identify each category on the customer side and on the agent side.

Everything else in this package (prompt templates, reply segments, the gold judge)
is built on these tables, so a category's keywords live in exactly one place.

Matching is done on lower-cased word sequences (see `words`), so a phrase such as
"charged twice" matches whole words only and "cancel" does not match "cancelled".
"""

from __future__ import annotations

import re

CATEGORIES: tuple[str, ...] = (
    "damaged item",
    "wrong item",
    "late delivery",
    "double charge",
    "password reset",
    "app crash",
    "refund",
    "cancellation",
)

# One-word product names, so that a small BPE tokenizer keeps each as a single token.
PRODUCTS: tuple[str, ...] = (
    "headphones",
    "blender",
    "lamp",
    "backpack",
    "kettle",
    "keyboard",
    "jacket",
    "toaster",
    "speaker",
    "watch",
)

# Categories whose customer messages name a product (the others are account / app issues).
PRODUCT_CATEGORIES: frozenset[str] = frozenset(
    {"damaged item", "wrong item", "late delivery", "double charge", "refund", "cancellation"}
)

# Customer side: phrases that identify the category of a message. The judge tries the
# categories in this order and takes the first one with a match, so more specific
# categories (a double charge, a cancellation) come before generic ones (late delivery,
# whose "where is my" also fits "where is my refund").
PROMPT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "double charge": ("charged twice", "billed twice", "billed me twice", "two charges", "double charge"),
    "password reset": ("password", "log in", "locked out"),
    "app crash": ("app",),
    "cancellation": ("cancel",),
    "refund": ("refund", "money back"),
    "wrong item": ("wrong", "instead of", "not what i ordered"),
    "damaged item": ("damaged", "broken", "cracked", "smashed"),
    "late delivery": ("late", "delayed", "not arrived", "still waiting", "still not here"),
}

# Agent side: mentioning one of these shows the reply addresses the customer's issue.
ISSUE_KEYWORDS: dict[str, tuple[str, ...]] = {
    "damaged item": ("damaged", "broken", "cracked"),
    "wrong item": ("wrong",),
    "late delivery": ("late", "delayed"),
    "double charge": ("charged twice", "double charge", "two charges"),
    "password reset": ("password", "log in"),
    "app crash": ("crash", "crashing", "crashes"),
    "refund": ("refund", "money back"),
    "cancellation": ("cancel",),
}

# Agent side: the concrete action that resolves each category. Every action phrase in
# `replies.py` contains exactly one marker of its own category and none of another's.
ACTION_MARKERS: dict[str, tuple[str, ...]] = {
    "damaged item": ("replacement",),
    "wrong item": ("correct item",),
    "late delivery": ("tracking",),
    "double charge": ("reversed",),
    "password reset": ("reset link",),
    "app crash": ("latest version",),
    "refund": ("refunded",),
    "cancellation": ("cancelled",),
}

EMPATHY_MARKERS: tuple[str, ...] = ("sorry", "apologize", "frustrating")
CLOSING_MARKERS: tuple[str, ...] = ("thank you for your patience", "have a great day", "anything else")

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    """Lower-cased alphabetic words of `text`; punctuation and digits are dropped."""
    return _WORD.findall(text.lower())


def count_phrase(tokens: list[str], phrase: str) -> int:
    """Number of (non-overlapping in practice) occurrences of a word phrase in `tokens`."""
    target = phrase.split()
    n = len(target)
    return sum(1 for i in range(len(tokens) - n + 1) if tokens[i : i + n] == target)


def count_any(tokens: list[str], phrases: tuple[str, ...]) -> int:
    """Total occurrences of all `phrases` in `tokens`."""
    return sum(count_phrase(tokens, p) for p in phrases)
