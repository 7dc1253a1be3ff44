"""JSON and JSONL files written whole: through a temporary file beside the target and an atomic rename, so a run
stopped mid-write leaves the previous complete file (or none), never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` (UTF-8), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, data) -> None:
    """``data`` as indented JSON (non-ASCII kept as is), atomically."""
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """One JSON object a line, atomically."""
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file, blank lines skipped."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
