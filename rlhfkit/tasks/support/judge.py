"""The hidden gold judge of the support task.

It stands in for the human whose preferences the reward model tries to learn: the
trainers never see it, the demo only reports it (`reward/gold`). It sees only the
prompt text and the reply, and recovers the category and product from the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache

from . import replies
from .categories import (
    ACTION_MARKERS,
    CLOSING_MARKERS,
    EMPATHY_MARKERS,
    ISSUE_KEYWORDS,
    PRODUCTS,
    count_any,
    words,
)
from .prompts import DETAILS, MESSAGE_TEMPLATES, parse_prompt

# Weights (max total 5.0 = 1.0 + 1.0 + 2.0 + 0.5 + 0.5).
W_EMPATHY = 1.0  # one empathy phrase; each extra one costs W_EMPATHY
W_ISSUE = 1.0  # half for naming the issue, half for naming the product
W_ACTION = 2.0  # the right action, once; each extra occurrence costs ACTION_REPEAT
ACTION_REPEAT = 0.75
W_WRONG_ACTION = 1.0  # cost per action phrase of another category
W_CLOSING = 0.5  # one polite closing; each extra one costs W_CLOSING
W_CONCISE = 0.5  # earned within LENGTH_BUDGET words
LENGTH_BUDGET = 32
LENGTH_COST = 0.15  # per word beyond the budget ...
LENGTH_FLOOR = -1.5  # ... down to this
W_REPETITION = 3.0  # times the fraction of repeated word trigrams
W_STUTTER = 0.5  # per immediately repeated word ("the the")
W_GIBBERISH = 4.0  # times the fraction of words outside the task's vocabulary
MIN_WORDS = 3  # fewer words than this is an empty reply
SCORE_MIN, SCORE_MAX = -3.0, 5.0


@dataclass(frozen=True)
class GoldBreakdown:
    """The judge's components; `total` is their sum clipped to [SCORE_MIN, SCORE_MAX]."""

    empathy: float
    issue: float
    action: float
    closing: float
    length: float
    repetition: float  # <= 0
    gibberish: float  # <= 0
    total: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@lru_cache(maxsize=1)
def vocabulary() -> frozenset[str]:
    """Every word the task's customer messages and agent replies use."""
    texts: list[str] = list(PRODUCTS)
    for templates in MESSAGE_TEMPLATES.values():
        texts.extend(templates)
    for details in DETAILS.values():
        texts.extend(details)
    for group in (
        replies.EMPATHY,
        replies.GREETINGS,
        replies.VAGUE_ACKNOWLEDGEMENTS,
        replies.GENERIC_ACTIONS,
        replies.CLOSINGS,
        replies.FILLERS,
    ):
        texts.extend(group)
    for table in (replies.ACKNOWLEDGEMENTS, replies.ACTIONS):
        for group in table.values():
            texts.extend(group)
    vocab = set()
    for text in texts:
        vocab.update(words(text.replace("{p}", " ").replace("{d}", " ")))
    return frozenset(vocab)


def gold_breakdown(prompt: str | list, reply: str | list) -> GoldBreakdown:
    """Score a reply to a prompt, component by component (see `gold_score`). A reply given as chat messages (an
    assistant turn) is scored on their text."""
    category, product = parse_prompt(prompt)
    tokens = words(_reply_text(reply))
    n = len(tokens)
    if n < MIN_WORDS:
        return GoldBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, SCORE_MIN)

    # Empathy: exactly one phrase earns the weight; each repeat costs as much again.
    n_empathy = count_any(tokens, EMPATHY_MARKERS)
    empathy = W_EMPATHY * (1 - (n_empathy - 1)) if n_empathy else 0.0

    # Issue: the category's words, plus the product when the customer named one.
    issue = 0.0
    if category is not None:
        named_issue = count_any(tokens, ISSUE_KEYWORDS[category]) > 0
        if product is None:
            issue = W_ISSUE * named_issue
        else:
            issue = 0.5 * W_ISSUE * (named_issue + (product in tokens))

    # Action: the right one once; repeats and other categories' actions cost.
    action = 0.0
    if category is not None:
        n_right = count_any(tokens, ACTION_MARKERS[category])
        n_wrong = sum(count_any(tokens, m) for c, m in ACTION_MARKERS.items() if c != category)
        if n_right:
            action += W_ACTION - ACTION_REPEAT * (n_right - 1)
        action -= W_WRONG_ACTION * n_wrong

    n_closing = count_any(tokens, CLOSING_MARKERS)
    closing = W_CLOSING * (1 - (n_closing - 1)) if n_closing else 0.0

    over = n - LENGTH_BUDGET
    length = W_CONCISE if over <= 0 else max(LENGTH_FLOOR, W_CONCISE - LENGTH_COST * over)

    # Repetition: share of word trigrams that already occurred, plus stutters.
    trigrams = list(zip(tokens, tokens[1:], tokens[2:]))
    repeated = len(trigrams) - len(set(trigrams))
    stutters = sum(a == b for a, b in zip(tokens, tokens[1:]))
    repetition = -(W_REPETITION * repeated / max(1, len(trigrams)) + W_STUTTER * stutters)

    vocab = vocabulary()
    oov = sum(t not in vocab for t in tokens)
    gibberish = -W_GIBBERISH * oov / n

    raw = empathy + issue + action + closing + length + repetition + gibberish
    total = min(SCORE_MAX, max(SCORE_MIN, raw))
    return GoldBreakdown(empathy, issue, action, closing, length, repetition, gibberish, round(total, 6))


def gold_score(prompt: str | list, reply: str | list) -> float:
    """Hidden gold score of `reply` to `prompt`, in [-3, 5]; deterministic.

    The category (and product, if any) are recovered from the customer message by
    keyword matching. Components, summed and clipped to [-3, 5]:

    - empathy    +1.0 for exactly one apology / empathy phrase ("sorry", "apologize",
                 "frustrating"); each additional one costs 1.0 (three apologies: -1.0).
    - issue      +1.0 for addressing the specific issue: +0.5 for naming it (the
                 category's keywords, e.g. "damaged", "charged twice", "password") and
                 +0.5 for naming the product from the prompt (+1.0 for the keywords alone
                 when the prompt names no product).
    - action     +2.0 for the right concrete action for the category (replacement,
                 correct item, tracking, reversed charge, reset link, latest version,
                 refunded, cancelled); each repeat of it costs 0.75; each action of
                 another category costs 1.0. A generic action ("Please contact us again
                 later.") earns 0.
    - closing    +0.5 for one polite closing; each additional one costs 0.5.
    - length     +0.5 within 32 words; beyond, 0.5 - 0.15 per extra word, floor -1.5.
    - repetition -3.0 x the fraction of repeated word trigrams, -0.5 per immediately
                 repeated word.
    - gibberish  -4.0 x the fraction of words outside the task's vocabulary.
    - a reply with fewer than 3 words (empty) scores -3.0.

    The best reply scores 5.0.
    """
    return gold_breakdown(prompt, reply).total


def _reply_text(completion: str | list | None) -> str:
    """A completion's text: a string as is, a chat's message contents joined, "" for None."""
    if completion is None:
        return ""
    if isinstance(completion, list):
        return "\n".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return completion


def gold_reward(prompts: Sequence, completions: Sequence, **kwargs) -> list[float]:
    """`gold_score` of each completion to its prompt, as a reward function with TRL's signature
    `(prompts, completions, **columns) -> list[float]`; extra keywords are ignored.

    A prompt is a string or a chat (the judge reads its last user message); a completion is a
    string, a chat (its message contents joined) or None (an empty reply, -3.0).
    """
    if len(completions) != len(prompts):
        raise ValueError(f"gold_reward: {len(completions)} completions for {len(prompts)} prompts")
    return [gold_score(p, _reply_text(c)) for p, c in zip(prompts, completions)]
