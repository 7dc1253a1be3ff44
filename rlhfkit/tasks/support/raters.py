"""The task's simulated raters as a pairwise judge: the rule that labelled its offline preference pairs, for the
replies a policy writes (``rlhfkit iterate --judge support``, the demo's iterated PPO)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from .dataset import RATER_TEMPERATURE
from .judge import gold_score


class SimulatedRaters:
    """``prefer(prompts, completions) -> list[int]`` in TRL's pairwise-judge convention: for each pair ``[a, b]``
    the raters answer 0 (a) with probability sigmoid((gold(a) − gold(b)) / RATER_TEMPERATURE), else 1 — the
    same noisy preference as ``make_preference_rows``. Seeded: one rater stream per ``seed``."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(f"support-raters-{seed}")

    def __call__(self, prompts: Sequence, completions: Sequence[Sequence], **kwargs) -> list[int]:
        answers = []
        for prompt, (a, b) in zip(prompts, completions):
            margin = (gold_score(prompt, a) - gold_score(prompt, b)) / RATER_TEMPERATURE
            answers.append(0 if self.rng.random() < 1.0 / (1.0 + math.exp(-margin)) else 1)
        return answers
