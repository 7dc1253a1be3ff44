"""Find the runs under the folders given to `rlhfkit view`, and read their metrics, samples and report.

A folder with ``metrics.jsonl`` is a run. A folder without one (``rlhfkit demo``'s output, a folder of
sweeps) stands for each of its sub-folders that has one, named ``folder/sub``. Files are read afresh on
every request, so a run still training shows its latest steps; a half-written last line is ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.errors import UserError, option

IMAGE_SUFFIXES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
MAX_SAMPLE_ROWS = 5000  # samples.jsonl rows sent to the page per run (the newest)


@dataclass(frozen=True)
class Run:
    name: str
    path: Path


@dataclass(frozen=True)
class Folder:
    """A folder given on the command line: its runs, and where its report is."""

    path: Path
    runs: list[Run]


def find_runs(paths: list[str]) -> list[Folder]:
    folders = []
    for text in paths:
        path = Path(text)
        if not path.is_dir():
            raise UserError(f"{path}: no such run folder")
        if (path / "metrics.jsonl").is_file():
            runs = [Run(path.resolve().name, path)]
        else:
            subs = sorted(p for p in path.iterdir() if (p / "metrics.jsonl").is_file())
            if not subs:
                raise UserError(
                    f"{path}: no metrics.jsonl in it or in its sub-folders (give a run's {option('output_dir')})"
                )
            runs = [Run(f"{path.resolve().name}/{p.name}", p) for p in subs]
        folders.append(Folder(path, runs))
    names = [run.name for folder in folders for run in folder.runs]
    if len(set(names)) != len(names):  # the same folder name twice (a/ppo and b/ppo): use the paths as given
        folders = [Folder(f.path, [Run(str(r.path), r.path) for r in f.runs]) for f in folders]
    return folders


def _jsonl(path: Path) -> list[dict]:
    rows = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line still being written, or damaged: the rest of the run is still worth showing
        if isinstance(row, dict):
            rows.append(row)
    return rows


def metrics(run: Run) -> list[dict]:
    """Rows of metrics.jsonl with their finite numbers only; rows without a step are numbered in order."""
    out = []
    for i, row in enumerate(_jsonl(run.path / "metrics.jsonl")):
        clean = {
            k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        clean.setdefault("step", i + 1)
        out.append(clean)
    return out


def samples(run: Run) -> list[dict]:
    """The newest rows of samples.jsonl (``{"step", "prompt", "response", "score"}`` as trainers write them).
    A multi-turn row's ``messages`` are sent as its ``turns`` (see ``conversation_turns``)."""
    rows = _jsonl(run.path / "samples.jsonl")[-MAX_SAMPLE_ROWS:]
    for row in rows:
        if "messages" in row:
            row["turns"] = conversation_turns(row.pop("messages"), row.get("prompt"))
    return rows


def conversation_turns(messages, prompt) -> list[dict]:
    """The turns of a conversation after its prompt, each ``{"role", "content", "kind"}``.

    kind: "reply" or "tool call" (an assistant turn that calls a tool: one with a ``<tool_call>`` tag, or one
    that tool results follow, whatever the call's format), "tool result" or "tool error" (a tool result
    starting with "error:"), "environment" (a user turn: in a rollout, users are the environment), "system",
    or "other" (any other role). The prompt is the conversation's first messages when they are the row's
    ``prompt`` (a string prompt being one user message), after a system message the run may have added;
    an environment that opened with messages of its own has all of its conversation shown. Entries that are
    not ``{"role", "content"}`` objects are skipped, and content that is not text is shown as JSON.
    """
    if not isinstance(messages, list):
        return []
    turns = [
        {"role": str(m.get("role", "")), "content": _text(m.get("content", ""))}
        for m in messages
        if isinstance(m, dict)
    ]
    if isinstance(prompt, str):
        opening = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list):
        opening = [
            {"role": str(m.get("role", "")), "content": _text(m.get("content", ""))}
            for m in prompt
            if isinstance(m, dict)
        ]
    else:
        opening = []
    start = 1 if turns and turns[0]["role"] == "system" and opening[:1] != turns[:1] else 0
    if opening and turns[start : start + len(opening)] == opening:
        turns = turns[start + len(opening) :]
    for i, turn in enumerate(turns):
        role, content = turn["role"], turn["content"]
        if role == "assistant":
            calls = "<tool_call>" in content or (i + 1 < len(turns) and turns[i + 1]["role"] == "tool")
            turn["kind"] = "tool call" if calls else "reply"
        elif role == "tool":
            turn["kind"] = "tool error" if content.startswith("error:") else "tool result"
        else:
            turn["kind"] = {"user": "environment", "system": "system"}.get(role, "other")
    return turns


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def report_source(folder: Path) -> tuple[str, str] | None:
    """(file name, Markdown) of a folder's report: report.md, else summary.json shown as a code block."""
    if (folder / "report.md").is_file():
        return "report.md", (folder / "report.md").read_text(encoding="utf-8", errors="replace")
    if (folder / "summary.json").is_file():
        text = (folder / "summary.json").read_text(encoding="utf-8", errors="replace")
        return "summary.json", f"```\n{text}\n```"
    return None


def image_file(folder: Path, relative: str) -> Path | None:
    """``folder/relative`` when it is an image inside ``folder`` (no way out through '..' or a link)."""
    try:
        target = (folder / relative).resolve()
        root = folder.resolve()
    except (OSError, RuntimeError):
        return None
    if root not in target.parents or target.suffix.lower() not in IMAGE_SUFFIXES or not target.is_file():
        return None
    return target
