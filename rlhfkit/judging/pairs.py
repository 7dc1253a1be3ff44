"""Pairs to judge, read from candidate rows (``prompt`` + ``responses: [a, b]``, as `rlhfkit generate
--num-samples 2` and `rlhfkit iterate` write them) or preference rows (``prompt``, ``chosen``, ``rejected``: read as
an unlabelled pair). Every row is checked before any model loads."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rlhfkit.data.readers import Row, read_rows
from rlhfkit.data.schema import Text, to_example
from rlhfkit.errors import UserError


@dataclass
class Pair:
    prompt: Text
    a: Text
    b: Text
    where: str  # the row's location, for messages


def pair_key(prompt: Text, x: Text, y: Text) -> str:
    """The same key for a pair whichever reply comes first."""
    first, second = sorted(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in (x, y))
    return json.dumps([prompt, first, second], ensure_ascii=False, sort_keys=True)


def _reply(row: Row, i: int, value) -> Text:
    name = f"responses[{i}]"
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value:
        for j, m in enumerate(value):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise UserError(f"{row.where(f'{name}[{j}]')}: expected an object with 'role' and 'content' strings")
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise UserError(f"{row.where(name)}: expected a non-empty string (or a list of chat messages)")


def to_pair(row: Row, command: str) -> Pair:
    """One row as a pair to judge; a UserError naming the file, row and field otherwise."""
    data = row.data
    if "responses" in data:
        if "prompt" not in data:
            raise UserError(f"{row.where('prompt')}: missing")
        prompt = to_example(Row({"prompt": data["prompt"]}, row.path, row.index, row.unit), "prompt", command).prompt
        replies = data["responses"]
        if not isinstance(replies, list) or len(replies) != 2:
            got = f"{len(replies)} replies" if isinstance(replies, list) else type(replies).__name__
            raise UserError(f"{row.where('responses')}: expected a list of two replies, got {got}")
        a, b = (_reply(row, i, r) for i, r in enumerate(replies))
        return Pair(prompt, a, b, row.where())
    if "chosen" in data or "rejected" in data:
        ex = to_example(row, "preference", command)
        return Pair(ex.prompt, ex.chosen, ex.rejected, row.where())
    keys = ", ".join(sorted(map(str, data))) or "none"
    raise UserError(
        f"{row.where()}: this row has neither 'responses' nor 'chosen'/'rejected' (fields: {keys}); {command} needs "
        "'prompt' and 'responses' (two replies), or 'prompt', 'chosen' and 'rejected'"
    )


def load_pairs(path: str, command: str) -> list[Pair]:
    return [to_pair(row, command) for row in read_rows(path)]


def load_reference(path: str, command: str) -> list[dict]:
    """People's labels as preference rows (one per label: a pair several people labelled has several), checked."""
    rows = []
    for row in read_rows(path):
        ex = to_example(row, "preference", command)
        rows.append({"prompt": ex.prompt, "chosen": ex.chosen, "rejected": ex.rejected})
    return rows
