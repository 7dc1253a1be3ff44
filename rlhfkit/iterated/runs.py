"""What every stage of `rlhfkit iterate` shares: the names of its files, reading a stage's logged metrics, and the
options of a stage's own run."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlhfkit.config.parts import RunArgs
from rlhfkit.files import read_jsonl
from rlhfkit.training.checkpoint import STATE_FILE, Checkpointer

ROUND_FILE = "round.json"
COMMAND = "rlhfkit iterate"
OPTIMIZER_FILE = "optimizer_state.pt"  # --carry-optimizer: a round's optimizer moments and schedule, for the next


def keep_optimizer_state(run_dir: Path) -> Path:
    """The trainer state of ``run_dir``'s last checkpoint (its optimizer's moments and schedule position) as
    ``run_dir/optimizer_state.pt``, the next round's --optimizer-state, kept when the checkpoints are dropped."""
    latest = Checkpointer(run_dir).latest()
    assert latest is not None, f"{run_dir}: the round's run left no checkpoint to carry its optimizer from"
    shutil.copy2(latest / STATE_FILE, run_dir / OPTIMIZER_FILE)
    return run_dir / OPTIMIZER_FILE


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
