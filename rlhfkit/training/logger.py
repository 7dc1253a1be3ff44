"""Metrics to ``metrics.jsonl`` and TensorBoard, and a progress bar, from the main process only."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tqdm.auto import tqdm


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
    """``log(step, {...})`` appends one JSON line (with ``"step"``) and TensorBoard scalars.

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
    ):
        self.enabled, self.desc = enabled, desc
        self.path = Path(output_dir) / "metrics.jsonl"
        self.writer = None
        self.bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if start_step > 0 and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step_of(line) <= start_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(output_dir) / "tensorboard"))
        self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, disable=not progress, dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key != "step" and value is not None:
                self.writer.add_scalar(key, value, step)
        shown = {
            k: f"{v:.4g}"
            for k, v in record.items()
            if k in ("loss", "reward/score", "kl/ref", "eval/loss") and v is not None
        }
        self.bar.set_postfix(shown, refresh=False)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.enabled:
            self.writer.add_text(tag, text, step)

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
            self.writer.flush()
            self.writer.close()


def close_progress_bars() -> None:
    """Close every progress bar still drawn. A command that stops with an error leaves its bar open; closed
    first, the bar ends its line, so the error is printed on a line of its own and no bar is redrawn after it
    (as an open bar would be when it is collected at exit)."""
    from tqdm import tqdm as any_bar  # the base class: its registry holds every bar, tqdm.auto's too

    for bar in list(getattr(any_bar, "_instances", ())):
        bar.close()
