"""Configs of the commands that serve local web pages: `rlhfkit label` (people compare responses) and
`rlhfkit view` (a run's curves, samples and report)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rlhfkit.config import options
from rlhfkit.config.checks import at_least
from rlhfkit.errors import UserError, command, option, spelled

STRENGTHS = ("slightly", "clearly", "much")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")


@dataclass
class ServeArgs:
    host: str = "127.0.0.1"
    """Interface to listen on. Only this machine can reach the default; another address (e.g. 0.0.0.0)
    exposes the pages to the network, over plain HTTP."""
    port: int = 8765
    """TCP port (0: any free port)."""


@dataclass
class LabelArgs:
    data: str = ""
    """Candidates to compare: rows with 'prompt' and 'responses' (a list of two or more, as `rlhfkit generate
    --num-samples K` writes), or preference rows ('prompt', 'chosen', 'rejected') to audit or re-label. Needed the
    first time; a restart on the same --output-dir continues from OUT/labels.sqlite."""
    output_dir: str = ""
    """Folder of the label store (labels.sqlite) and of the exported prefs.jsonl, ties.jsonl and agreement.json."""
    annotators: str = ""
    """Comma-separated annotator names, each given a private URL with a token (default: one annotator named
    'annotator'). Names may be added on a restart; existing ones keep their URLs."""
    labels_per_item: int = 0
    """Different annotators who label each pair; 0 keeps the number a restarted store has (1 for a new one)."""
    pairs: Literal["cycle", "all"] = "cycle"
    """Pairs shown from a row of K > 2 responses: 'cycle' compares r1-r2, r2-r3, ..., rK-r1 (K pairs, every
    response in two, all connected for ranking); 'all' every one of the K(K-1)/2 pairs."""
    guidelines: str = ""
    """Markdown file of labelling guidelines, one click away on the page."""
    strength_margins: str = "slightly=0.33,clearly=0.67,much=1.0"
    """Margin written to prefs.jsonl for each optional strength ('slightly', 'clearly', 'much' better), as
    NAME=NUMBER pairs; `rlhfkit rm` then needs score(chosen) - score(rejected) above it."""
    seed: int = options.seed()


@dataclass
class ExportArgs:
    export: bool = False
    """Write OUT/prefs.jsonl, OUT/ties.jsonl and OUT/agreement.json from the labels so far, and exit."""
    aggregate: Literal["none", "majority"] = "none"
    """prefs.jsonl rows: 'none' one per A/B judgment; 'majority' one per pair, by majority vote of its
    annotators (pairs whose vote is a tie, both bad or split go to ties.jsonl)."""


@dataclass
class LabelConfig:
    """Prints one private URL per annotator. Each sees one pair at a time, in their own random order and with
    the two responses on sides drawn for them, and answers A better, B better, tie, both bad or skip (keys 1, 2,
    3, 4, s; u undoes the last answer). Every answer is on disk before the page confirms it; restarting on the
    same --output-dir continues where everyone was. --export then writes prefs.jsonl (read by rm and dpo as it
    is), ties.jsonl and agreement.json."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("output_dir",)
    label: LabelArgs = field(default_factory=LabelArgs)
    export: ExportArgs = field(default_factory=ExportArgs)
    serve: ServeArgs = field(default_factory=ServeArgs)

    def check(self) -> None:
        at_least(0, labels_per_item=self.label.labels_per_item)
        if not 0 <= self.serve.port <= 65535:
            raise UserError(f"{option('port')} must be in 0..65535, got {self.serve.port}")
        for name in self.annotator_names():
            if not _NAME.fullmatch(name):
                raise UserError(
                    f"{option('annotators')}: '{name}' is not a name (letters, digits, '_', '.', '-'; 40 at most)"
                )
        self.margins()

    def annotator_names(self) -> list[str]:
        names = [n.strip() for n in self.label.annotators.split(",") if n.strip()]
        if len(set(names)) != len(names):
            raise UserError(f"{option('annotators')}: a name is given twice ({self.label.annotators})")
        return names

    def margins(self) -> dict[str, float]:
        """``--strength-margins`` as {strength: margin}; every strength must have one."""
        out: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in self.label.strength_margins.split(","))):
            name, _, value = part.partition("=")
            try:
                out[name.strip()] = float(value)
            except ValueError:
                raise UserError(f"{option('strength_margins')}: expected NAME=NUMBER, got '{part}'") from None
        if set(out) != set(STRENGTHS):
            raise UserError(
                f"{option('strength_margins')} must give exactly {', '.join(STRENGTHS)}, got {', '.join(out)}"
            )
        return out


@dataclass
class ViewConfig:
    """Serves one page per run: every metric of metrics.jsonl as a curve (several runs overlaid), the samples by
    step (samples.jsonl) and the report (report.md, else summary.json). A folder without metrics.jsonl, such as
    `rlhfkit demo`'s, stands for each of its sub-folders that has one."""

    REQUIRED: ClassVar[tuple[str, ...]] = ()
    POSITIONAL: ClassVar[str] = "runs"  # `rlhfkit view RUN_DIR [RUN_DIR ...]`
    POSITIONAL_METAVAR: ClassVar[str] = "RUN_DIR"
    runs: list[str] = field(default_factory=list)
    """Run folders (OUTPUT_DIR of a training command or of `rlhfkit demo`); also given as arguments."""
    serve: ServeArgs = field(default_factory=lambda: ServeArgs(port=8766))

    def check(self) -> None:
        if not self.runs:
            usage = spelled("rlhfkit view RUN_DIR [RUN_DIR ...]", "runs=[RUN_DIR, ...]")
            raise UserError(f"{command('view')}: give at least one run folder ({usage})")
        if not 0 <= self.serve.port <= 65535:
            raise UserError(f"{option('port')} must be in 0..65535, got {self.serve.port}")
