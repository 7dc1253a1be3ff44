"""Customer messages: templates x slots, a fixed train/eval split, and the parser
the gold judge uses to recover the category and product from a prompt.

Prompt format (plain text for causal LMs; the reply follows with a leading space):

    Customer: My blender arrived damaged.
    Agent:
"""

from __future__ import annotations

import random
from functools import cache, lru_cache

from .categories import CATEGORIES, PRODUCTS, PROMPT_KEYWORDS, count_any, words

# `{p}` is a product, `{d}` a short detail for the account / app categories.
MESSAGE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "damaged item": (
        "My {p} arrived damaged.",
        "The {p} I ordered came broken.",
        "My new {p} is cracked and does not work.",
        "The {p} was damaged in the box when it arrived.",
        "The {p} showed up broken, what can you do?",
        "I got my {p} today but it is damaged.",
        "Your courier delivered my {p} smashed.",
        "The {p} arrived with a broken part.",
    ),
    "wrong item": (
        "You sent me the wrong {p}.",
        "I got the wrong item instead of my {p}.",
        "The box had the wrong {p} in it.",
        "I ordered a black {p} but you sent the wrong color.",
        "I received a {p} that is not what I ordered.",
        "My package had the wrong {p}, not the one I picked.",
        "Wrong {p} delivered, please help.",
        "I received a different order instead of my {p}.",
    ),
    "late delivery": (
        "My {p} has not arrived yet.",
        "Where is my {p}? It is late.",
        "My {p} order is two weeks late.",
        "I am still waiting for my {p} delivery.",
        "The {p} was due on Monday and is still not here.",
        "My {p} delivery is delayed again.",
        "Tracking says my {p} is delayed, when will it come?",
        "It has been ten days and my {p} has not arrived.",
    ),
    "double charge": (
        "I was charged twice for my {p}.",
        "You billed me twice for the same {p} order.",
        "There are two charges on my card for one {p}.",
        "I see a double charge for my {p}.",
        "My card was charged twice when I bought the {p}.",
        "Why was I billed twice for a {p}?",
        "I paid once for my {p} but see two charges.",
        "Please fix the double charge on my {p} order.",
    ),
    "refund": (
        "I would like a refund for my {p}.",
        "Can I get my money back for the {p}?",
        "I returned the {p} and want a refund.",
        "How do I get a refund on my {p} order?",
        "I do not like the {p}, please refund me.",
        "The {p} is not for me, I want my money back.",
        "I sent the {p} back last week, where is my refund?",
        "Please refund the {p} I bought.",
    ),
    "cancellation": (
        "I want to cancel my {p} order.",
        "Please cancel the {p} I ordered today.",
        "Can I cancel my order for the {p}?",
        "I changed my mind, cancel the {p} please.",
        "How do I cancel my {p} order before it ships?",
        "Cancel my {p} order, I ordered it by mistake.",
        "I need to cancel the {p} I bought this morning.",
        "Please stop my {p} order, I want to cancel it.",
    ),
    "password reset": (
        "I forgot my password and cannot log in {d}.",
        "The password reset email never arrives {d}.",
        "I am locked out of my account {d}.",
        "How do I reset my password {d}?",
        "My password does not work {d}.",
        "I cannot log in to my account {d}, please help.",
        "The reset email for my password has expired {d}.",
        "I need a new password, I am locked out {d}.",
    ),
    "app crash": (
        "The app keeps crashing {d}.",
        "Your app crashes {d}.",
        "The app freezes and closes {d}.",
        "Your app stopped working {d}.",
        "Every time I use the app it crashes {d}.",
        "The app shuts down {d}.",
        "My app keeps closing {d}.",
        "The app will not stay open {d}.",
    ),
}

DETAILS: dict[str, tuple[str, ...]] = {
    "password reset": (
        "on my phone",
        "on my laptop",
        "on my tablet",
        "on the website",
        "since yesterday",
        "this morning",
    ),
    "app crash": (
        "when I open it",
        "when I pay",
        "at checkout",
        "on my phone",
        "on my tablet",
        "after the update",
    ),
}

EVAL_FRACTION = 0.2
_SPLIT_SEED = "rlhfkit-support-split-v1"  # fixed: the split never depends on a run's seed


def format_prompt(message: str) -> str:
    """Wrap a customer message in the plain-text dialogue format the models see."""
    return f"Customer: {message}\nAgent:"


def _messages(category: str) -> list[str]:
    out = []
    for template in MESSAGE_TEMPLATES[category]:
        if "{p}" in template:
            out.extend(template.format(p=p) for p in PRODUCTS)
        else:
            out.extend(template.format(d=d) for d in DETAILS[category])
    return out


@cache
def _split() -> dict[str, tuple[dict, ...]]:
    """Stratified split: within each category, a fixed shuffle puts 20% in eval."""
    rng = random.Random(_SPLIT_SEED)
    train, eval_ = [], []
    seen: set[str] = set()
    for category in CATEGORIES:
        messages = [m for m in dict.fromkeys(_messages(category)) if m not in seen]
        seen.update(messages)
        rng.shuffle(messages)
        n_eval = round(len(messages) * EVAL_FRACTION)
        rows = [{"prompt": format_prompt(m), "category": category} for m in messages]
        eval_.extend(rows[:n_eval])
        train.extend(rows[n_eval:])
    return {"train": tuple(train), "eval": tuple(eval_)}


def make_prompts(split: str) -> list[dict]:
    """All prompts of a split ("train" or "eval") as `{"prompt", "category"}` dicts.

    Deterministic and independent of any seed; no message is in both splits and every
    category appears in both.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return [dict(row) for row in _split()[split]]


def customer_message(prompt: str | list) -> str:
    """The last customer message in a prompt.

    Accepts the plain-text format above (the text after the last "Customer:" up to
    "Agent:"), any other string (taken whole), or a list of chat messages (the last
    user message).
    """
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
        return users[-1] if users else ""
    text = prompt
    if "Customer:" in text:
        text = text.rsplit("Customer:", 1)[1]
    if "Agent:" in text:
        text = text.split("Agent:", 1)[0]
    return text.strip()


def detect_category(message: str) -> str | None:
    """First category (in `PROMPT_KEYWORDS` order) whose keywords occur in the message."""
    tokens = words(message)
    for category, keywords in PROMPT_KEYWORDS.items():
        if count_any(tokens, keywords):
            return category
    return None


def detect_product(message: str) -> str | None:
    """The product named in the message, if any."""
    tokens = set(words(message))
    for product in PRODUCTS:
        if product in tokens:
            return product
    return None


def parse_prompt(prompt: str | list) -> tuple[str | None, str | None]:
    """`(category, product)` recovered from the prompt text alone (either may be None)."""
    if isinstance(prompt, str):
        return _parse_text(prompt)
    message = customer_message(prompt)
    return detect_category(message), detect_product(message)


@lru_cache(maxsize=4096)
def _parse_text(prompt: str) -> tuple[str | None, str | None]:
    # The judge is called many times per prompt during PPO; parsing is cached.
    message = customer_message(prompt)
    return detect_category(message), detect_product(message)
