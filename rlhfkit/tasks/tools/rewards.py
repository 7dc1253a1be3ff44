"""The checkable reward and the gold judge of the tools task, and what a conversation says about tool use.

``exact_answer`` is called as TRL calls a reward function, `fn(prompts=, completions=, **columns) ->
list[float | None]`; in a multi-turn run `prompts` are the messages each conversation opened with and
`completions` every message after them (replies and tool results; the last assistant message is the final
reply), and the `answer` column arrives as a keyword list aligned with them (other keywords are accepted and
ignored). A reply is well-formed when it is one whole number and nothing else, surrounding whitespace aside
(" 10711"); a reply that still calls the tool (the turns ran out) is not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rlhfkit.tasks.arithmetic.rewards import answer_column

from .problems import parse_prompt, prompt_text

_NUMBER = re.compile(r"\s*(-?[0-9]+)\s*")


def reply_text(reply: str | list | None) -> str:
    """The text of a reply: a string as is, the last assistant message of a chat, "" for None."""
    if reply is None:
        return ""
    if isinstance(reply, list):
        replies = [m.get("content", "") for m in reply if isinstance(m, dict) and m.get("role") == "assistant"]
        return str(replies[-1]) if replies else ""
    return reply


def parse_answer(reply: str | list | None) -> int | None:
    """The number a well-formed reply consists of; None for any other reply."""
    match = _NUMBER.fullmatch(reply_text(reply))
    return int(match.group(1)) if match else None


def _expected(prompts: Sequence, answer: Sequence | None) -> list[int | None]:
    """Per row, the right answer: the `answer` column when given, else the sum asked in the prompt."""
    if answer is None:
        return [None if (p := parse_prompt(prompt)) is None else p.answer for prompt in prompts]
    return answer_column(prompts, answer)


def exact_answer(
    prompts: Sequence, completions: Sequence, answer: Sequence | None = None, **kwargs
) -> list[float | None]:
    """1.0 where the final reply is exactly the row's answer (one number), else 0.0.

    The answer comes from the `answer` column (ints or integer strings); without that column it is the sum
    the prompt asks. A row whose answer is None, or whose prompt asks no sum when there is no column, gets
    None (not applicable).
    """
    if len(completions) != len(prompts):
        raise ValueError(f"completions: {len(completions)} values for {len(prompts)} prompts")
    return [
        None if want is None else float(parse_answer(reply) == want)
        for reply, want in zip(completions, _expected(prompts, answer))
    ]


def judge(prompt: str | list, reply: str | list) -> float:
    """Gold judge: 1.0 when `reply` is exactly the sum the prompt asks, else 0.0. The sum is read from the
    prompt's text (the last "a + b + ..." in it), so no answer column is needed; a prompt that asks none is a
    ValueError."""
    problem = parse_prompt(prompt)
    if problem is None:
        raise ValueError(f"tools judge: no sum 'a + b + ...' in prompt {prompt_text(prompt)!r}")
    return float(parse_answer(reply) == problem.answer)
