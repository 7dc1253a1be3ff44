"""What the result tables share: the result files and their runs, the line under a table naming them, and the
numbers' formatting. Standard library only."""

from __future__ import annotations

import functools
import json
import math
import statistics
import textwrap
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
REPORTED = BENCH / "reported"
WIDTH = 110  # the docs' line width, for the text under a table

AVX2 = "AMD EPYC; torch kernels AVX2, avx2; 2 cores"
AVX512_RECORDED = "AMD EPYC; torch kernels AVX512, avx2 avx512f avx512_bf16; 2 cores"
XEON_AMX = "Intel(R) Xeon(R) Processor; torch kernels AVX512, avx2 avx512f avx512_bf16 amx_bf16; 2 cores"
AVX512 = "AMD EPYC; AVX-512 with bf16 (described, not recorded); 2 cores"


@functools.cache
def load(benchmark: str) -> dict:
    return json.loads((REPORTED / f"{benchmark}.json").read_text())


class Run:
    """One run of a result file, with where it is (for the line under a table)."""

    def __init__(self, benchmark: str, machine: str, key: str):
        path = REPORTED / f"{benchmark}.json"
        data = load(benchmark)
        try:
            self.data = data["machines"][machine][key]
        except KeyError:
            raise SystemExit(f"tables: {path.relative_to(ROOT)} has no run {machine!r} / {key!r}") from None
        self.file, self.machine, self.key = path.relative_to(ROOT).as_posix(), machine, key

    def __getitem__(self, name):
        return self.data[name]

    def seeds(self, size: str, name: str) -> list[tuple[int, dict]]:
        """(seed, run) for each repeat of ``name`` at ``size``: a run's own seed, else the first seed + k."""
        runs = self.data["sizes"][size]["runs"][name]
        return [(r.get("seed", self.data["args"]["seed"] + k), r) for k, r in enumerate(runs)]


def every_run(benchmark: str) -> list[Run]:
    """Every run in ``benchmark``'s result file, machine by machine, in the file's order."""
    return [Run(benchmark, machine, key) for machine, keys in load(benchmark)["machines"].items() for key in keys]


def sources(*runs: Run) -> str:
    """The line under a table: each file and machine, with the run keys used (their count where there are many;
    the table's function in this file names them)."""
    by_place: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        keys = by_place.setdefault((run.file, run.machine), [])
        if run.key not in keys:
            keys.append(run.key)
    parts = [
        f"`{file}`, {cpu_label(machine)}: "
        + (
            f"run{'s' if len(keys) > 1 else ''} " + ", ".join(f"`{k}`" for k in keys)
            if len(keys) <= 2
            else f"{len(keys)} runs"
        )
        for (file, machine), keys in by_place.items()
    ]
    return wrap("Runs: " + "; ".join(parts) + ".")


def wrap(text: str) -> str:
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


# ---- numbers --------------------------------------------------------------------------------------
def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0)


def pm(ms: tuple[float, float], digits: int = 2, sign: str = "") -> str:
    return f"{ms[0]:{sign}.{digits}f} ± {ms[1]:.{digits}f}"


def diff_se(a: list[float], b: list[float]) -> tuple[float, float]:
    """Difference of two means and its standard error (independent samples)."""
    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    return ma - mb, math.sqrt(sa**2 + sb**2)


def cpu_label(machine: str) -> str:
    cpu, isa, cores = (machine.split("; ") + ["", "", ""])[:3]
    low = isa.lower()
    width = "AVX-512" if ("avx-512" in low or "avx512" in low) else "AVX2" if "avx2" in low else isa
    return f"{cpu}, {width}, {cores}"


def row(*cells) -> str:
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def table(header: list[str], rows: list[list]) -> list[str]:
    return [row(*header), "|" + "---|" * len(header), *(row(*r) for r in rows)]
