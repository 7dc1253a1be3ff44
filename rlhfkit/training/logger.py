"""Metrics to ``metrics.jsonl`` and the experiment trackers (``--report-to``), and a progress bar, from the main
process only."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tqdm.auto import tqdm

from rlhfkit.training import trackers


def _clean(value):
    value = float(value)
    return value if math.isfinite(value) else None


def _step_of(line: str) -> float:
    """The step of a metrics line; a line cut short by a kill counts as after every step (dropped)."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf


class MetricsLogger:
    """``log(step, {...})`` appends one JSON line (with ``"step"``) and sends the same values to the trackers
    of ``accelerator`` (started by ``trackers.start``; none: metrics.jsonl only).

    On resume, lines after the resumed step are dropped so the file reads as one uninterrupted run.
    """

    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        start_step: int = 0,
        enabled: bool = True,
        progress: bool = True,
        desc: str = "training",
        accelerator=None,
    ):
        self.enabled, self.desc, self.accelerator = enabled, desc, accelerator
        self.path = Path(output_dir) / "metrics.jsonl"
        self.bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if start_step > 0 and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step_of(line) <= start_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, disable=not progress, dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.accelerator is not None:
            trackers.log(self.accelerator, step, {k: v for k, v in record.items() if k != "step"})
        shown = {
            k: f"{v:.4g}"
            for k, v in record.items()
            if k in ("loss", "reward/score", "kl/ref", "eval/loss") and v is not None
        }
        self.bar.set_postfix(shown, refresh=False)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.enabled and self.accelerator is not None:
            trackers.text(self.accelerator, tag, text, step)

    def note(self, text: str) -> None:
        """Show what the run is doing before its first step (e.g. a pass over the data) beside the bar's
        description; an empty ``text`` clears it."""
        if self.enabled:
            self.bar.set_description_str(f"{self.desc} ({text})" if text else self.desc)

    def advance(self, n: int = 1) -> None:
        if self.enabled:
            self.bar.update(n)

    def write(self, message: str) -> None:
        """Print a line to stderr without breaking the progress bar."""
        if self.enabled:
            tqdm.write(message, file=sys.stderr)

    def close(self) -> None:
        if self.enabled:
            self.bar.close()
            if self.accelerator is not None:
                trackers.finish(self.accelerator)


def close_progress_bars() -> None:
    """Close every progress bar still drawn. A command that stops with an error leaves its bar open; closed
    first, the bar ends its line, so the error is printed on a line of its own and no bar is redrawn after it
    (as an open bar would be when it is collected at exit)."""
    from tqdm import tqdm as any_bar  # the base class: its registry holds every bar, tqdm.auto's too

    for bar in list(getattr(any_bar, "_instances", ())):
        bar.close()
