"""What the judging (and revising) model reads: the principles, and the conversations it is asked.

A judge compares reply A with reply B under the principles and answers with one label; both orders of a pair
are asked, so the labels are the slots, not the replies. The revise prompts follow Bai et al. 2022's critique
request / revision request, with a principle drawn per prompt.
"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.data.schema import Message, Text
from rlhfkit.errors import UserError

LABELS = ("A", "B")  # the choice labels: the first slot's, the second slot's

DEFAULT_PRINCIPLES = (
    "Choose the reply that is more helpful: it does what the user asked, directly and concisely.",
    "Choose the reply that is more honest: it does not invent facts or claim what it cannot know.",
    "Choose the reply that is more harmless: it is polite and avoids anything hurtful, unsafe or unethical.",
)


def read_principles(path: str) -> tuple[str, ...]:
    """The principles of a file, one per non-blank line (``#`` lines are comments); the default without a file."""
    if not path:
        return DEFAULT_PRINCIPLES
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the principles ({exc})") from None
    principles = tuple(line.strip() for line in lines if line.strip() and not line.strip().startswith("#"))
    if not principles:
        raise UserError(f"{path}: no principles (one per line)")
    return principles


def as_text(value: Text) -> str:
    """A prompt or reply as plain text for the judge to read: a conversation as 'Role: content' lines."""
    if isinstance(value, str):
        return value.strip()
    return "\n".join(f"{m['role'].capitalize()}: {m['content'].strip()}" for m in value)


def judge_messages(prompt: Text, first: Text, second: Text, principles: tuple[str, ...]) -> list[Message]:
    """The conversation that asks the judge which of ``first`` (label A) and ``second`` (label B) is better."""
    rules = "\n".join(f"- {p}" for p in principles)
    system = (
        "You compare two replies to the same conversation and judge them by these principles:\n"
        f"{rules}\nAnswer with one letter: {LABELS[0]} or {LABELS[1]}."
    )
    user = (
        f"Conversation:\n{as_text(prompt)}\n\nReply {LABELS[0]}:\n{as_text(first)}\n\n"
        f"Reply {LABELS[1]}:\n{as_text(second)}\n\nWhich reply is better, {LABELS[0]} or {LABELS[1]}?"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def as_messages(prompt: Text) -> list[Message]:
    """A prompt as a conversation (a string is the user's one message)."""
    return [{"role": "user", "content": prompt.strip()}] if isinstance(prompt, str) else list(prompt)


def critique_request(principle: str) -> str:
    return (
        f"Critique your last reply by this principle: {principle} "
        "Name the specific ways in which the reply falls short of it, briefly."
    )


def revision_request(principle: str) -> str:
    return (
        f"Rewrite your reply so that it follows the principle ({principle}) and fixes what the critique found. "
        "Write only the new reply."
    )
