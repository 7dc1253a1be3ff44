"""Does a reply name the customer's product? A measure the demo reports beside the gold score.

The gold judge already rewards naming the product (half of its issue component); this counts it
separately, because naming the wrong product ("I see your lamp arrived damaged" to a customer whose
speaker broke) is the mistake a reader spots first in a small model's replies.
"""

from __future__ import annotations

from collections.abc import Sequence

from .categories import PRODUCTS, words
from .prompts import parse_prompt


def product_naming(prompt: str | list, reply: str) -> tuple[bool, bool] | None:
    """`(names a product, names the customer's product and no other)` for a prompt that names a product;
    None when the customer names none (account and app issues)."""
    _, product = parse_prompt(prompt)
    if product is None:
        return None
    named = set(words(reply)) & set(PRODUCTS)
    return bool(named), named == {product}


def product_naming_shares(prompts: Sequence, replies: Sequence[str]) -> dict[str, float]:
    """Over the replies to prompts that name a product:

    - ``names_product``: the share of those that name a product whose product is the customer's (and no
      other) — how often a reply that names a product names the right one;
    - ``mentions_product``: the share that name any product at all.

    NaN when no prompt names a product (or, for ``names_product``, no reply names one).
    """
    if len(prompts) != len(replies):
        raise ValueError(f"product_naming_shares: {len(replies)} replies for {len(prompts)} prompts")
    marks = [m for m in (product_naming(p, r) for p, r in zip(prompts, replies)) if m is not None]
    mentions = [right for named, right in marks if named]
    return {
        "names_product": sum(mentions) / len(mentions) if mentions else float("nan"),
        "mentions_product": len(mentions) / len(marks) if marks else float("nan"),
    }
