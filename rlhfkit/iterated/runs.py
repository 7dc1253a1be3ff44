"""What every stage of `rlhfkit iterate` shares: its files (written whole through a temporary file, so a stopped
run leaves the last complete one), the options of a stage's own run, and running a command on a config."""

from __future__ import annotations

import json
from pathlib import Path

from rlhfkit.config.parts import RunArgs

ROUND_FILE = "round.json"
COMMAND = "rlhfkit iterate"


def write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return read_jsonl(path) if path.is_file() else []


def last_mean(rows: list[dict], key: str, k: int = 5) -> float | None:
    """The mean of ``key`` over the last ``k`` logged steps that have it (None if none)."""
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values[-k:]) / len(values[-k:]) if values else None


def run_args(c, out: Path, seed: int) -> RunArgs:
    """A stage's own run options: into ``out`` (replacing what a stopped run left there), the loop's logging,
    precision, device and progress bar (of ``c``, the loop's config)."""
    return RunArgs(
        output_dir=str(out),
        overwrite_output_dir=True,  # what a stopped run left of this unfinished model is replaced
        seed=seed,
        logging_steps=c.run.logging_steps,
        mixed_precision=c.run.mixed_precision,
        cpu=c.run.cpu,
        progress=c.run.progress,
    )


def execute(command: str, config) -> dict:
    from rlhfkit.cli.main import execute

    return execute(command, config)
