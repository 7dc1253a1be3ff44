"""Arithmetic problems: the fixed problem set, its train/eval split, the prompt format and
the parser that recovers a problem from a prompt.

Prompt format (plain text for causal LMs; the answer follows with a leading space):

    Q: 7+5=
    A:

A problem is `a + b` or `a - b` with operands in 0..MAX_OPERAND; subtraction only when
`a >= b`, so every answer is a non-negative integer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache

# 0..12 gives 260 problems: a held-out split of 52 to measure accuracy on, and a table
# small enough that a ~0.2M-parameter model learns much of it in about a thousand SFT steps.
MAX_OPERAND = 12
OPERATORS = ("+", "-")
EVAL_FRACTION = 0.2  # share of problems held out of SFT and RL, per operator

# The last "Q: a+b=" in a text; spaces around the numbers and the operator are allowed.
_PROBLEM = re.compile(r"Q:\s*([0-9]+)\s*([+-])\s*([0-9]+)\s*=")


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def prompt(self) -> str:
        return format_prompt(self.a, self.op, self.b)


def format_prompt(a: int, op: str, b: int) -> str:
    """The prompt text of `a op b`, e.g. "Q: 7+5=\\nA:"."""
    if op not in OPERATORS:
        raise ValueError(f"operator must be one of {OPERATORS}, got {op!r}")
    return f"Q: {a}{op}{b}=\nA:"


def all_problems() -> list[Problem]:
    """Every problem of the task, in a fixed order (additions, then subtractions)."""
    span = range(MAX_OPERAND + 1)
    problems = [Problem(a, "+", b) for a in span for b in span]
    problems += [Problem(a, "-", b) for a in span for b in span if a >= b]
    return problems


@cache
def _split() -> dict[str, tuple[Problem, ...]]:
    # Seed-independent, so every run of the task holds out the same problems; each
    # operator contributes EVAL_FRACTION of its problems to the eval split.
    rng = random.Random("arithmetic-split")
    train: list[Problem] = []
    eval_: list[Problem] = []
    for op in OPERATORS:
        problems = [p for p in all_problems() if p.op == op]
        rng.shuffle(problems)
        n_eval = round(EVAL_FRACTION * len(problems))
        eval_.extend(problems[:n_eval])
        train.extend(problems[n_eval:])
    return {"train": tuple(train), "eval": tuple(eval_)}


def make_problems(split: str) -> list[Problem]:
    """The problems of a split ("train" or "eval"); fixed, disjoint, both operators in each."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return list(_split()[split])


def prompt_text(prompt: str | list | None) -> str:
    """The text of a prompt: a string as is, the last user message of a chat, "" for None."""
    if prompt is None:
        return ""
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return users[-1] if users else ""
    return prompt


def parse_prompt(prompt: str | list | None) -> Problem | None:
    """The problem a prompt asks (its last "Q: a+b=" / "Q: a-b="), or None when it asks none."""
    matches = _PROBLEM.findall(prompt_text(prompt))
    if not matches:
        return None
    a, op, b = matches[-1]
    return Problem(int(a), op, int(b))
