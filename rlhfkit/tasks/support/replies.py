"""Agent replies assembled from segments: opener, acknowledgement, action, closing.

`sample_reply` draws the mixed-quality replies used for SFT demonstrations and for
preference pairs: each segment is present with some probability, and the action is
sometimes generic or belongs to another category. `sample_wide_reply` adds the
occasional terse, padded or complete reply. No generator repeats a segment, so
replies that repeat an apology or pile up actions never appear in the data.
"""

from __future__ import annotations

import random

from .categories import CATEGORIES

# Each empathy phrase holds exactly one empathy marker ("sorry", "apologize", "frustrating").
EMPATHY = (
    "I am so sorry about this.",
    "I apologize for the trouble.",
    "Sorry for the inconvenience.",
    "I understand how frustrating this is.",
    "We are very sorry about that.",
)
# Greetings with no empathy marker: polite, but they earn nothing from the judge.
GREETINGS = (
    "Hello, thanks for contacting us.",
    "Hi there, thanks for reaching out.",
    "Thanks for your message.",
)

# Acknowledgements name the issue (and the product, `{p}`, where the prompt has one).
ACKNOWLEDGEMENTS: dict[str, tuple[str, ...]] = {
    "damaged item": ("I see your {p} arrived damaged.", "I understand the {p} came broken."),
    "wrong item": ("I see we sent the wrong {p}.", "I understand you got the wrong {p}."),
    "late delivery": ("I see your {p} is running late.", "I understand your {p} delivery is delayed."),
    "double charge": (
        "I see you were charged twice for the {p}.",
        "I see a double charge for your {p}.",
    ),
    "refund": ("I see you want a refund for the {p}.", "You want your money back for the {p}."),
    "cancellation": ("I see you want to cancel the {p} order.", "I understand you need to cancel your {p}."),
    "password reset": ("I see you cannot log in.", "I understand your password is not working."),
    "app crash": ("I see the app keeps crashing.", "I understand the app crashes for you."),
}
VAGUE_ACKNOWLEDGEMENTS = (
    "I see there is a problem with your order.",
    "I understand there is an issue.",
    "I have looked into your case.",
)

# Each action holds exactly one marker of its own category (see categories.ACTION_MARKERS).
ACTIONS: dict[str, tuple[str, ...]] = {
    "damaged item": ("I will send you a free replacement today.", "A free replacement is on its way to you."),
    "wrong item": ("I will ship the correct item to you today.", "The correct item ships today with a return label."),
    "late delivery": ("The tracking shows it will arrive in two days.", "Here is your tracking link, it arrives soon."),
    "double charge": ("I have reversed the extra charge on your card.", "The extra charge has been reversed."),
    "refund": ("I have refunded the full amount to your card.", "Your payment has been refunded in full."),
    "cancellation": ("I have cancelled the order at no charge.", "Your order is now cancelled."),
    "password reset": ("I sent a new reset link to your email.", "Please use the reset link I just emailed you."),
    "app crash": (
        "Please install the latest version and restart the app.",
        "Installing the latest version will fix this.",
    ),
}
GENERIC_ACTIONS = (
    "Please contact us again later.",
    "Our team will look into this.",
    "Please check our help page for more details.",
    "We will get back to you soon.",
)

CLOSINGS = (
    "Thank you for your patience.",
    "Have a great day.",
    "Let me know if you need anything else.",
)
# Extra sentences that only add length (used by the wide generator).
FILLERS = (
    "Our team is always here to help.",
    "We really value your business.",
    "Your satisfaction is our top priority.",
    "We work hard to make every order perfect.",
)

MIN_WORDS, MAX_WORDS = 8, 35

# Segment probabilities of the mixed-quality generator.
P_EMPATHY, P_GREETING = 0.55, 0.25  # else no opener
P_ACK_SPECIFIC, P_ACK_VAGUE = 0.55, 0.2  # else no acknowledgement
P_ACTION_RIGHT, P_ACTION_GENERIC, P_ACTION_WRONG = 0.45, 0.3, 0.2  # else no action
P_CLOSING = 0.5


def _fill(sentence: str, product: str | None) -> str:
    return sentence.format(p=product or "order")


def acknowledgement(rng: random.Random, category: str, product: str | None) -> str:
    return _fill(rng.choice(ACKNOWLEDGEMENTS[category]), product)


def right_action(rng: random.Random, category: str) -> str:
    return rng.choice(ACTIONS[category])


def wrong_action(rng: random.Random, category: str) -> str:
    other = rng.choice([c for c in CATEGORIES if c != category])
    return rng.choice(ACTIONS[other])


def _draw(rng: random.Random, options: list[tuple[float, object]]):
    """Pick one value from `(probability, value)` pairs; the remainder picks None."""
    u, cumulative = rng.random(), 0.0
    for p, value in options:
        cumulative += p
        if u < cumulative:
            return value() if callable(value) else value
    return None


def _mixed_segments(rng: random.Random, category: str, product: str | None) -> list[str]:
    opener = _draw(rng, [(P_EMPATHY, lambda: rng.choice(EMPATHY)), (P_GREETING, lambda: rng.choice(GREETINGS))])
    ack = _draw(
        rng,
        [
            (P_ACK_SPECIFIC, lambda: acknowledgement(rng, category, product)),
            (P_ACK_VAGUE, lambda: rng.choice(VAGUE_ACKNOWLEDGEMENTS)),
        ],
    )
    action = _draw(
        rng,
        [
            (P_ACTION_RIGHT, lambda: right_action(rng, category)),
            (P_ACTION_GENERIC, lambda: rng.choice(GENERIC_ACTIONS)),
            (P_ACTION_WRONG, lambda: wrong_action(rng, category)),
        ],
    )
    closing = rng.choice(CLOSINGS) if rng.random() < P_CLOSING else None
    return [s for s in (opener, ack, action, closing) if s]


def sample_reply(rng: random.Random, category: str, product: str | None) -> str:
    """A mixed-quality reply of MIN_WORDS..MAX_WORDS words, each segment at most once."""
    while True:
        reply = " ".join(_mixed_segments(rng, category, product))
        if MIN_WORDS <= len(reply.split()) <= MAX_WORDS:
            return reply


def ideal_reply(rng: random.Random, category: str, product: str | None) -> str:
    """Every segment present and right: empathy, acknowledgement, action, closing."""
    return " ".join(
        [
            rng.choice(EMPATHY),
            acknowledgement(rng, category, product),
            right_action(rng, category),
            rng.choice(CLOSINGS),
        ]
    )


def sample_wide_reply(rng: random.Random, category: str, product: str | None) -> str:
    """A reply from outside the usual mix: terse, padded with filler, or ideal."""
    kind = rng.choice(("terse", "padded", "ideal"))
    if kind == "terse":
        return rng.choice(GENERIC_ACTIONS + ACTIONS[category] + GREETINGS)
    if kind == "ideal":
        return ideal_reply(rng, category, product)
    segments = _mixed_segments(rng, category, product)
    fillers = rng.sample(FILLERS, k=rng.randint(1, 3))
    return " ".join(segments[:1] + fillers + segments[1:])
