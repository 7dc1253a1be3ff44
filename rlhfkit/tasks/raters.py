"""Simulated raters for any task with a gold judge: the Bradley–Terry model of a noisy person, who prefers
reply A to reply B with probability sigmoid((gold(A) - gold(B)) / T). The temperature T sets the label noise:
the larger, the more often the raters pick the reply the gold judge scores lower."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

Judge = Callable[[str, str], float]


def prefers_first(rng: random.Random, judge: Judge, prompt: str, a: str, b: str, temperature: float) -> bool:
    """One rater's draw: True when it prefers ``a`` (probability sigmoid((gold(a) - gold(b)) / temperature))."""
    margin = (judge(prompt, a) - judge(prompt, b)) / temperature
    return rng.random() < 1.0 / (1.0 + math.exp(-margin))


class GoldRaters:
    """``prefer(prompts, completions) -> list[int]`` in TRL's pairwise-judge convention, answering 0 (the first
    reply) or 1 as ``prefers_first`` draws; one seeded stream of draws per ``(name, seed)``."""

    def __init__(self, name: str, judge: Judge, temperature: float, seed: int = 0):
        self.judge, self.temperature = judge, temperature
        self.rng = random.Random(f"{name}-raters-{seed}")

    def __call__(self, prompts: Sequence, completions: Sequence[Sequence], **kwargs) -> list[int]:
        return [
            0 if prefers_first(self.rng, self.judge, prompt, a, b, self.temperature) else 1
            for prompt, (a, b) in zip(prompts, completions)
        ]


def labelled_pair(rng: random.Random, judge: Judge, prompt: str, reply: Callable[[], str], temperature: float) -> dict:
    """A preference row of two different replies drawn from ``reply()`` (drawn again until they differ), as the
    raters label them."""
    a, b = reply(), reply()
    while b == a:
        b = reply()
    chosen, rejected = (a, b) if prefers_first(rng, judge, prompt, a, b, temperature) else (b, a)
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
