"""Problems of the tools task: sums of several 3- and 4-digit numbers, their prompts, the fixed held-out set,
and the parser that recovers a sum from a prompt's text.

A prompt is one user message, the numbers joined by " + " ("1234 + 567 + 8910"). Sums this long are out of
reach of a model small enough to train on a CPU in minutes, so the way to the right answer is the ``add``
tool (``calculator.add``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache

from rlhfkit.tasks.arithmetic.problems import prompt_text

TERMS = 3  # numbers per sum
DIGITS = (3, 4)  # each number has 3 or 4 digits, as likely
EVAL_PROBLEMS = 100  # the fixed held-out set, drawn apart from every training problem

# The last "a + b + ..." of a text: two or more whole numbers joined by "+".
_SUM = re.compile(r"\d+(?:\s*\+\s*\d+)+")


@dataclass(frozen=True)
class Problem:
    numbers: tuple[int, ...]

    @property
    def answer(self) -> int:
        return sum(self.numbers)

    @property
    def text(self) -> str:
        """The user message: "1234 + 567 + 8910"."""
        return " + ".join(str(n) for n in self.numbers)

    @property
    def prompt(self) -> list[dict]:
        return [{"role": "user", "content": self.text}]


def random_problem(rng: random.Random) -> Problem:
    """TERMS numbers, each of 3 or 4 digits (which, at random; then a uniform number of that many digits)."""
    numbers = []
    for _ in range(TERMS):
        digits = rng.choice(DIGITS)
        numbers.append(rng.randrange(10 ** (digits - 1), 10**digits))
    return Problem(tuple(numbers))


@cache
def eval_problems() -> tuple[Problem, ...]:
    """The held-out problems: fixed (the same for every seed), all different."""
    rng = random.Random("tools-eval")
    found: dict[Problem, None] = {}
    while len(found) < EVAL_PROBLEMS:
        found[random_problem(rng)] = None
    return tuple(found)


def train_problems(rng: random.Random, n: int) -> list[Problem]:
    """`n` problems for training, drawn with `rng`; none of them is a held-out problem."""
    held_out = set(eval_problems())
    out: list[Problem] = []
    while len(out) < n:
        problem = random_problem(rng)
        if problem not in held_out:
            out.append(problem)
    return out


def parse_prompt(prompt: str | list | None) -> Problem | None:
    """The sum a prompt asks (its last "a + b + ..."), or None when it asks none. A prompt may be the user's
    text, a chat, or a conversation rendered as text ("User: 1234 + 567 + 8910\\nAssistant:")."""
    matches = _SUM.findall(prompt_text(prompt))
    if not matches:
        return None
    return Problem(tuple(int(n) for n in re.findall(r"\d+", matches[-1])))
