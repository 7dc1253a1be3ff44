"""What the docs' tables share: the result files, the runs a table shows (named selections in bench/tables.json),
the line under a table naming them, and the Markdown. Standard library only.

bench/tables.json holds, for each selection, the result file (its benchmark), the machine (a short name for a
machine key of that file) and a rule for the runs:

    "demo/tiny": {"benchmark": "demo", "machine": "xeon-amx", "runs": "newest", "key_lacks": "--model"}

``"runs"`` is ``"newest"`` (the run with the latest stamp date; ``"key_has"`` / ``"key_lacks"`` narrow the runs it
picks from by text in their run key), ``"all"`` (every run on the machine, in the file's order, narrowed the same
way) or a list of run keys, in the order their seeds or rows combine.
"""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
REPORTED = BENCH / "reported"
SELECTIONS = BENCH / "tables.json"
WIDTH = 110  # the docs' line width, for the text under a table


@functools.cache
def load(benchmark: str) -> dict:
    return json.loads((REPORTED / f"{benchmark}.json").read_text())


@functools.cache
def selections() -> dict:
    return json.loads(SELECTIONS.read_text())


def machine_key(name: str) -> str:
    """The machine key a short name of bench/tables.json stands for."""
    try:
        return selections()["machines"][name]
    except KeyError:
        raise SystemExit(f"tables: bench/tables.json names no machine {name!r}") from None


class Run:
    """One run of a result file, with where it is (for the line under a table) and the selection that picked it."""

    def __init__(self, benchmark: str, machine: str, key: str, selection: str = ""):
        path = REPORTED / f"{benchmark}.json"
        try:
            self.data = load(benchmark)["machines"][machine][key]
        except KeyError:
            raise SystemExit(f"tables: {path.relative_to(ROOT)} has no run {machine!r} / {key!r}") from None
        self.file, self.machine, self.key, self.selection = path.relative_to(ROOT).as_posix(), machine, key, selection

    def __getitem__(self, name):
        return self.data[name]

    def get(self, name, default=None):
        return self.data.get(name, default)

    def seeds(self, size: str, name: str) -> list[tuple[int, dict]]:
        """(seed, run) for each repeat of ``name`` at ``size``: a run's own seed, else the first seed + k."""
        runs = self.data["sizes"][size]["runs"][name]
        return [(r.get("seed", self.data["args"]["seed"] + k), r) for k, r in enumerate(runs)]


def select(name: str) -> list[Run]:
    """The runs of selection ``name`` of bench/tables.json, by its rule."""
    try:
        rule = selections()["selections"][name]
    except KeyError:
        raise SystemExit(f"tables: bench/tables.json has no selection {name!r}") from None
    machine = machine_key(rule["machine"])
    on_machine = load(rule["benchmark"])["machines"].get(machine, {})
    keys = list(on_machine)
    if "key_has" in rule:
        keys = [k for k in keys if rule["key_has"] in k]
    if "key_lacks" in rule:
        keys = [k for k in keys if rule["key_lacks"] not in k]
    if rule["runs"] == "newest":
        keys = [max(keys, key=lambda k: on_machine[k]["stamp"]["date"])] if keys else []
    elif rule["runs"] != "all":
        keys = list(rule["runs"])
    if not keys:
        raise SystemExit(f"tables: selection {name!r} picks no run")
    return [Run(rule["benchmark"], machine, key, name) for key in keys]


def sources(*runs: Run) -> str:
    """The line under a table: each file and machine with its number of runs, and the selections that picked
    them (bench/tables.json names the runs)."""
    by_place: dict[tuple[str, str], list[str]] = {}
    names: list[str] = []
    for run in runs:
        keys = by_place.setdefault((run.file, run.machine), [])
        if run.key not in keys:
            keys.append(run.key)
        if run.selection and run.selection not in names:
            names.append(run.selection)
    parts = [
        f"`{file}`, {cpu_label(machine)}: {len(keys)} run{'s' if len(keys) > 1 else ''}"
        for (file, machine), keys in by_place.items()
    ]
    picked = f" (selection{'s' if len(names) > 1 else ''} {', '.join(f'`{n}`' for n in names)} of `bench/tables.json`)"
    return wrap("Runs: " + "; ".join(parts) + (picked if names else "") + ".")


def wrap(text: str) -> str:
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def p_text(p: float | None) -> str:
    """A p-value as the tables print it (small ones as a bound; the t-test's integration is not exact there)."""
    if p is None:
        return "—"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.01 else f"p = {p:.2f}"


def cpu_label(machine: str) -> str:
    cpu, isa, cores = (machine.split("; ") + ["", "", ""])[:3]
    low = isa.lower()
    width = "AVX-512" if ("avx-512" in low or "avx512" in low) else "AVX2" if "avx2" in low else isa
    return f"{cpu}, {width}, {cores}"


def row(*cells) -> str:
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def table(header: list[str], rows: list[list]) -> list[str]:
    return [row(*header), "|" + "---|" * len(header), *(row(*r) for r in rows)]
