"""Validate raw rows into typed examples, before any training starts.

Field names follow the Hugging Face TRL conventions. A text field is either a non-empty
string or a conversation: a non-empty list of ``{"role": ..., "content": ...}`` messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from rlhfkit.data.readers import Row, read_rows
from rlhfkit.errors import UserError

Message = dict[str, str]
Text = str | list[Message]
ROLES = ("system", "user", "assistant", "tool")
HH_MARKER = "Assistant:"


@dataclass
class PromptExample:
    prompt: Text
    extra: dict[str, Any] = field(default_factory=dict)  # other fields of the row, passed through to outputs


@dataclass
class SFTExample:
    """Either prompt/completion, or a full conversation (``messages``) trained on its assistant turns."""

    prompt: Text | None = None
    completion: Text | None = None
    messages: list[Message] | None = None


@dataclass
class PreferenceExample:
    prompt: Text
    chosen: Text
    rejected: Text
    margin: float | None = None


@dataclass
class ScoredExample:
    prompt: Text
    response: Text
    extra: dict[str, Any] = field(default_factory=dict)


Kind = Literal["prompt", "sft", "preference", "prompt_response"]
EXPECTS = {
    "prompt": "'prompt'",
    "sft": "'prompt' and 'completion', or 'messages'",
    "preference": "'chosen' and 'rejected' (and usually 'prompt')",
    "prompt_response": "'prompt' and 'response' (or 'completion')",
}


def _text(row: Row, name: str, conversation_roles=ROLES) -> Text:
    if name not in row.data or row.data[name] is None:
        raise UserError(f"{row.where(name)}: missing")
    value = row.data[name]
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{row.where(name)}: empty string")
        return value
    if isinstance(value, list):
        return _messages(row, name, value, conversation_roles)
    raise UserError(f"{row.where(name)}: expected a string or a list of messages, got {type(value).__name__}")


def _messages(row: Row, name: str, value: list, roles=ROLES) -> list[Message]:
    if not value:
        raise UserError(f"{row.where(name)}: empty list of messages")
    out = []
    for i, msg in enumerate(value):
        label = f"{name}[{i}]"
        if not isinstance(msg, dict):
            raise UserError(f"{row.where(label)}: expected an object with 'role' and 'content'")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str):
            raise UserError(f"{row.where(label + '.role')}: missing or not a string")
        if role not in roles:
            raise UserError(f"{row.where(label + '.role')}: unknown role '{role}' (expected one of {', '.join(roles)})")
        if not isinstance(content, str):
            raise UserError(f"{row.where(label + '.content')}: missing or not a string")
        if not content.strip() and role != "system":
            raise UserError(f"{row.where(label + '.content')}: empty string")
        out.append({"role": role, "content": content})
    return out


def _kind_of(data: dict) -> str:
    if "chosen" in data or "rejected" in data:
        return "preference"
    if "messages" in data or "completion" in data:
        return "sft"
    if "response" in data:
        return "prompt_response"
    if "prompt" in data:
        return "prompt"
    return "unknown"


def _wrong_kind(row: Row, kind: Kind, command: str) -> UserError:
    found = _kind_of(row.data)
    keys = ", ".join(sorted(map(str, row.data))) or "none"
    what = f"looks like {found} data" if found != "unknown" else "has no known fields"
    return UserError(f"{row.where()}: this row {what} (fields: {keys}); {command} needs {EXPECTS[kind]}")


def split_implicit_prompt(row: Row, chosen: Text, rejected: Text) -> tuple[Text, Text, Text]:
    """Split HH-style full transcripts into (prompt, chosen response, rejected response).

    Strings: the prompt is the shared prefix up to and including the last ``Assistant:``.
    Conversations: the prompt is the shared messages before the final assistant turn.
    """
    if isinstance(chosen, str) and isinstance(rejected, str):
        common = 0
        for a, b in zip(chosen, rejected):
            if a != b:
                break
            common += 1
        cut = chosen.rfind(HH_MARKER, 0, common)  # the last marker lying wholly in the shared prefix
        if cut < 0:
            raise UserError(
                f"{row.where('chosen')}: no 'prompt' field and no shared '{HH_MARKER}' turn to split the prompt at"
            )
        end = cut + len(HH_MARKER)
        if not chosen[end:].strip() or not rejected[end:].strip():
            raise UserError(f"{row.where('chosen')}: empty response after the last '{HH_MARKER}'")
        return chosen[:end], chosen[end:], rejected[end:]
    if isinstance(chosen, list) and isinstance(rejected, list):
        for name, conv in (("chosen", chosen), ("rejected", rejected)):
            if conv[-1]["role"] != "assistant":
                raise UserError(f"{row.where(name)}: the last message must be the assistant's response")
        if chosen[:-1] != rejected[:-1] or len(chosen) < 2:
            raise UserError(
                f"{row.where('chosen')}: no 'prompt' field and chosen/rejected do not share the turns before the last"
            )
        return chosen[:-1], [chosen[-1]], [rejected[-1]]
    raise UserError(f"{row.where('rejected')}: 'chosen' and 'rejected' must both be strings or both message lists")


def to_example(row: Row, kind: Kind, command: str):
    data = row.data
    if kind == "prompt":
        if "prompt" not in data:
            raise _wrong_kind(row, kind, command)
        prompt = _text(row, "prompt")
        return PromptExample(prompt, {k: v for k, v in data.items() if k != "prompt"})
    if kind == "sft":
        if "messages" in data:
            msgs = _text(row, "messages")
            if not isinstance(msgs, list):
                raise UserError(f"{row.where('messages')}: expected a list of messages")
            if not any(m["role"] == "assistant" for m in msgs):
                raise UserError(f"{row.where('messages')}: no assistant message to learn from")
            return SFTExample(messages=msgs)
        if "prompt" in data and "completion" in data:
            prompt, completion = _text(row, "prompt"), _text(row, "completion")
            if isinstance(prompt, str) != isinstance(completion, str):
                raise UserError(
                    f"{row.where('completion')}: prompt and completion must both be strings or both message lists"
                )
            return SFTExample(prompt=prompt, completion=completion)
        if "completion" in data:
            raise UserError(f"{row.where('prompt')}: missing")
        raise _wrong_kind(row, kind, command)
    if kind == "preference":
        if "chosen" not in data and "rejected" not in data:
            raise _wrong_kind(row, kind, command)
        chosen, rejected = _text(row, "chosen"), _text(row, "rejected")
        if "prompt" in data:
            prompt = _text(row, "prompt")
        else:
            prompt, chosen, rejected = split_implicit_prompt(row, chosen, rejected)
        margin = data.get("margin")
        if margin is not None and (
            isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin)
        ):
            raise UserError(f"{row.where('margin')}: expected a finite number, got {margin!r}")
        return PreferenceExample(prompt, chosen, rejected, None if margin is None else float(margin))
    if kind == "prompt_response":
        name = "response" if "response" in data else "completion" if "completion" in data else None
        if "prompt" not in data or name is None:
            raise _wrong_kind(row, kind, command)
        return ScoredExample(
            _text(row, "prompt"), _text(row, name), {k: v for k, v in data.items() if k not in ("prompt", name)}
        )
    raise ValueError(f"unknown data kind {kind}")


def load_examples(path: str, kind: Kind, command: str) -> list:
    """Read and validate every row of ``path`` as ``kind``; the first bad row raises UserError."""
    return [to_example(row, kind, command) for row in read_rows(path)]
