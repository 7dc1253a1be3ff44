"""What people label: pairs of responses to one prompt, read from a candidates file.

A row is either ``{"prompt", "responses": [r1, ..., rK]}`` (K >= 2, as `rlhfkit generate --num-samples K`
writes) or a preference row ``{"prompt", "chosen", "rejected"}`` (section "preferences" of the data formats,
HH-style transcripts included), whose two responses are shown unlabelled to be judged afresh. Rows are
checked with the trainers' rules and errors (file, line, field).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from rlhfkit.data.readers import Row, read_rows
from rlhfkit.data.schema import Text, _text, to_example
from rlhfkit.errors import UserError

COMMAND = "rlhfkit label"


@dataclass(frozen=True)
class Pair:
    """Two responses to one prompt. ``x`` and ``y`` are the file's order; the page shows them in an order drawn
    per annotator (``left`` = "x" or "y")."""

    prompt: Text
    x: Text
    y: Text
    source: str  # "FILE: line N" (responses i and j), for people tracing a label back
    x_index: int  # position of x (and y) in the row's responses; chosen = 0 and rejected = 1 for preference rows
    y_index: int


def pair_indices(k: int, how: str) -> list[tuple[int, int]]:
    """Which responses of a row of ``k`` are compared: 'cycle' (0-1, 1-2, ..., (k-1)-0: every response in two
    pairs and all of them connected, so a Bradley-Terry fit can rank the whole row) or 'all' (every pair)."""
    if k == 2:
        return [(0, 1)]
    if how == "all":
        return list(itertools.combinations(range(k), 2))
    return [(i, (i + 1) % k) for i in range(k)]


def _responses(row: Row) -> list[Text]:
    value = row.data["responses"]
    if not isinstance(value, list):
        raise UserError(f"{row.where('responses')}: expected a list of responses, got {type(value).__name__}")
    if len(value) < 2:
        raise UserError(f"{row.where('responses')}: needs two or more responses to compare, got {len(value)}")
    out = []
    for i, _ in enumerate(value):
        proxy = Row({f"responses[{i}]": value[i]}, row.path, row.index, row.unit)
        out.append(_text(proxy, f"responses[{i}]"))
    return out


def row_pairs(row: Row, how: str) -> list[Pair]:
    data = row.data
    where = row.where()
    if "responses" in data:
        if "prompt" not in data:
            raise UserError(f"{row.where('prompt')}: missing")
        prompt, responses = _text(row, "prompt"), _responses(row)
        return [
            Pair(prompt, responses[i], responses[j], f"{where} (responses {i + 1} and {j + 1})", i, j)
            for i, j in pair_indices(len(responses), how)
            if responses[i] != responses[j]  # identical texts: nothing to choose between
        ]
    if "chosen" in data or "rejected" in data:
        ex = to_example(row, "preference", COMMAND)
        return [Pair(ex.prompt, ex.chosen, ex.rejected, where, 0, 1)] if ex.chosen != ex.rejected else []
    keys = ", ".join(sorted(map(str, data))) or "none"
    raise UserError(
        f"{where}: this row has no responses to compare (fields: {keys}); {COMMAND} needs 'prompt' and "
        "'responses' (a list of two or more), or 'chosen' and 'rejected'"
    )


def read_pairs(path: str, how: str = "cycle") -> list[Pair]:
    """Every pair to label in ``path``, in file order; the first bad row raises UserError."""
    pairs = [pair for row in read_rows(path) for pair in row_pairs(row, how)]
    if not pairs:
        raise UserError(f"{path}: no pair of different responses to compare")
    return pairs
