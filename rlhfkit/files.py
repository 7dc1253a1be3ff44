"""JSON and JSONL files written whole: through a temporary file beside the target and an atomic rename, so a run
stopped mid-write leaves the previous complete file (or none), never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text(path: str | Path, text: str) -> Path:
    """``text`` into ``path`` (UTF-8), atomically; returns the path."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_json(path: str | Path, data) -> Path:
    """``data`` as indented JSON (non-ASCII kept as is), atomically; returns the path."""
    return write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, rows) -> Path:
    """One JSON object a line (non-ASCII kept as is), atomically; returns the path."""
    return write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file, blank lines skipped."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
