"""Read rows from JSONL, JSON, Parquet or a ``datasets.save_to_disk`` folder, remembering where each came from.

Errors name the file and the line (JSONL) or row (other formats), so a user can fix the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.errors import UserError


@dataclass(frozen=True)
class Row:
    """One input record and its location: ``line N`` for JSONL, ``row N`` (1-based) otherwise."""

    data: dict[str, Any]
    path: str
    index: int  # 1-based line (JSONL) or row number
    unit: str  # "line" or "row"

    def where(self, field: str | None = None) -> str:
        text = f"{self.path}: {self.unit} {self.index}"
        return text + (f": field '{field}'" if field else "")


def row_location(path: str | Path, index: int) -> str:
    """Where the ``index``-th row (0-based, as read) of the data file ``path`` is, named as ``Row.where`` names
    it: ``PATH: line N`` for JSONL (the line in the file, blank lines counted), ``PATH: row N`` otherwise. For
    an error found after reading, when only the row's index is at hand."""
    p = Path(path)
    if p.suffix == ".jsonl" and p.is_file():
        with p.open("rb") as handle:
            filled = (number for number, raw in enumerate(handle, start=1) if raw.strip())
            for i, number in enumerate(filled):
                if i == index:
                    return f"{p}: line {number}"
    return f"{p}: row {index + 1}"


def read_rows(path: str | Path) -> list[Row]:
    """All rows of a data file or folder; raises UserError for a missing, empty or unreadable file."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such file or directory")
    if p.is_dir():
        rows = _read_dataset_dir(p)
    elif p.suffix == ".jsonl":
        rows = _read_jsonl(p)
    elif p.suffix == ".json":
        rows = _read_json(p)
    elif p.suffix == ".parquet":
        rows = _read_parquet(p)
    else:
        raise UserError(f"{p}: unsupported data format '{p.suffix}' (use .jsonl, .json, .parquet or a datasets folder)")
    if not rows:
        raise UserError(f"{p}: the file has no rows")
    return rows


def _read_jsonl(p: Path) -> list[Row]:
    rows = []
    with p.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{p}: line {number}: not valid UTF-8 (byte {exc.start})") from None
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise UserError(f"{p}: line {number}: broken JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise UserError(f"{p}: line {number}: expected a JSON object, got {type(obj).__name__}")
            rows.append(Row(obj, str(p), number, "line"))
    return rows


def _read_json(p: Path) -> list[Row]:
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise UserError(f"{p}: line {line}: not valid UTF-8") from None
    if not text.strip():
        return []
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}: line {exc.lineno}: broken JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(obj, dict):  # {"data": [...]} or a single record
        lists = [v for v in obj.values() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        obj = lists[0] if len(lists) == 1 and len(obj) == 1 else [obj]
    if not isinstance(obj, list):
        raise UserError(f"{p}: expected a JSON list of objects")
    rows = []
    for number, item in enumerate(obj, start=1):
        if not isinstance(item, dict):
            raise UserError(f"{p}: row {number}: expected a JSON object, got {type(item).__name__}")
        rows.append(Row(item, str(p), number, "row"))
    return rows


def _read_parquet(p: Path) -> list[Row]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(f"{p}: cannot read Parquet ({str(exc).splitlines()[0]})") from None
    return [Row(_present(item), str(p), number, "row") for number, item in enumerate(table.to_pylist(), start=1)]


def _present(item: dict) -> dict:
    """Drop null cells: a columnar file stores a field absent from a row as null (mixed-format rows)."""
    return {k: v for k, v in item.items() if v is not None}


def _read_dataset_dir(p: Path) -> list[Row]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as exc:  # not a save_to_disk folder
        raise UserError(f"{p}: not a datasets.save_to_disk folder ({str(exc).splitlines()[0]})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise UserError(f"{p}: a DatasetDict needs a 'train' split (has {', '.join(ds)})")
        ds = ds["train"]
    return [Row(_present(dict(item)), str(p), number, "row") for number, item in enumerate(ds, start=1)]
