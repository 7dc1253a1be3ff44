"""Checkable rewards of the arithmetic task.

The reward functions are called as TRL calls them, `fn(prompts=, completions=, **columns) ->
list[float | None]`: `prompts` and `completions` are aligned lists, and each extra
column of the prompt data arrives as a keyword list aligned with them (`answer=[...]`);
other keywords (`completion_ids`, `trainer_state`, ...) are accepted and ignored. A prompt or
completion may be a string or a chat (a list of `{"role", "content"}` messages: a chat prompt's
completion is `[{"role": "assistant", "content": ...}]`); None counts as "".

A completion is well-formed when it is one integer and nothing else, surrounding
whitespace aside (" 12", "12\\n", " -3"); that integer is its answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .problems import parse_prompt, prompt_text

_NUMBER = re.compile(r"\s*(-?[0-9]+)\s*")
_LEADING_NUMBER = re.compile(r"\s*-?[0-9]+")


def completion_text(completion: str | list | None) -> str:
    """The text of a completion: a string as is, a chat's message contents joined, "" for None."""
    if completion is None:
        return ""
    if isinstance(completion, list):
        return "\n".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return completion


def parse_answer(completion: str | list | None) -> int | None:
    """The integer a well-formed completion consists of; None for any other completion."""
    match = _NUMBER.fullmatch(completion_text(completion))
    return int(match.group(1)) if match else None


def _check_aligned(name: str, prompts: Sequence, column: Sequence) -> None:
    if len(column) != len(prompts):
        raise ValueError(f"{name}: {len(column)} values for {len(prompts)} prompts; columns must align with prompts")


def _expected(prompts: Sequence, answer: Sequence | None) -> list[int | None]:
    """Per row, the right answer: the `answer` column when given, else solved from the prompt."""
    if answer is None:
        solved = [parse_prompt(p) for p in prompts]
        return [None if p is None else p.answer for p in solved]
    return answer_column(prompts, answer)


def answer_column(prompts: Sequence, answer: Sequence) -> list[int | None]:
    """The `answer` column as integers (ints or integer strings; None stays None), aligned with `prompts`."""
    _check_aligned("answer", prompts, answer)
    expected: list[int | None] = []
    for i, value in enumerate(answer):
        if value is None:
            expected.append(None)
            continue
        try:
            expected.append(int(str(value).strip()))
        except ValueError:
            raise ValueError(f"answer[{i}]: {value!r} is not an integer") from None
    return expected


def exact_answer(
    prompts: Sequence, completions: Sequence, answer: Sequence | None = None, **kwargs
) -> list[float | None]:
    """1.0 where the completion is well-formed and its integer equals the row's answer, else 0.0.

    The answer comes from the `answer` column (ints or integer strings); without that column
    it is solved from the prompt. A row whose answer is None, or whose prompt asks no problem
    when there is no column, gets None (not applicable). A number with extra text (" 12 13",
    " 12.") earns 0.0: only the exact answer counts.
    """
    _check_aligned("completions", prompts, completions)
    expected = _expected(prompts, answer)
    return [
        None if want is None else float(parse_answer(completion) == want)
        for completion, want in zip(completions, expected)
    ]


def format_reward(prompts: Sequence, completions: Sequence, **kwargs) -> list[float]:
    """1.0 for a well-formed completion (one integer, right or wrong); 0.5 for an integer
    followed by other text (" 12 13", " 12 apples"); 0.0 otherwise (empty, None, text first)."""
    _check_aligned("completions", prompts, completions)
    scores = []
    for completion in completions:
        text = completion_text(completion)
        if _NUMBER.fullmatch(text):
            scores.append(1.0)
        elif _LEADING_NUMBER.match(text):
            scores.append(0.5)
        else:
            scores.append(0.0)
    return scores


def accuracy(prompts: Sequence, completions: Sequence, answers: Sequence | None = None) -> float:
    """Share of completions that are exactly the right answer (`exact_answer` averaged over the
    rows it applies to; `answers` None solves each prompt)."""
    scores = [s for s in exact_answer(prompts, completions, answer=answers) if s is not None]
    if not scores:
        raise ValueError("accuracy needs at least one row with a known answer")
    return sum(scores) / len(scores)


def judge(prompt: str | list, reply: str | list) -> float:
    """Gold judge: 1.0 when `reply` is exactly the answer to the problem in `prompt`, else 0.0.

    The problem is parsed from the prompt itself ("Q: 7+5=" -> 12), so no answer column is
    needed; a prompt that asks no problem is a ValueError.
    """
    problem = parse_prompt(prompt)
    if problem is None:
        raise ValueError(f"arithmetic judge: no 'Q: a+b=' or 'Q: a-b=' problem in prompt {prompt_text(prompt)!r}")
    return float(parse_answer(reply) == problem.answer)
