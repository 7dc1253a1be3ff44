"""The stamp every JSON result of bench/ carries: which code measured it, when, on what machine, under what load.

    stamp = Stamp()                     # at the start of a run
    result["stamp"] = stamp.record()    # at every write of the result (the load at that moment is the end load)
    print(summary(result["stamp"]))     # one line, printed under the table

    {"commit": "<git HEAD sha>[-dirty]", "date": "<UTC ISO-8601, start of the run>",
     "machine": {"cpu", "isa", "logical_cores", "ram_gib", "os", "kernel", "python", "torch", "rlhfkit"},
     "load": {"start": [1, 5, 15 min], "end": [1, 5, 15 min], "warning": null or a sentence}}

``-dirty``: tracked files under rlhfkit/ or bench/ differ from HEAD (staged or not) when the run starts.
Only the standard library is used here; torch is asked for its version and kernel level, rlhfkit for its version.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata, util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY_LOAD = 0.5  # a 1-minute load average above this at the start: something else was running


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def watched_paths() -> list[str]:
    """bench/ and the rlhfkit package's directory (found without importing it), relative to the repository."""
    paths = ["bench", "rlhfkit"]
    try:
        spec = util.find_spec("rlhfkit")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        try:
            rel = Path(location).resolve().relative_to(ROOT).as_posix()
        except ValueError:  # installed outside this repository
            continue
        if rel not in paths:
            paths.append(rel)
    return paths


def git_commit() -> str | None:
    """HEAD's sha, with ``-dirty`` when tracked files under rlhfkit/ or bench/ have uncommitted changes;
    outside a git work tree the BENCH_COMMIT environment variable's value, or None."""
    try:
        sha = _git("rev-parse", "HEAD")
        changed = _git("status", "--porcelain", "--untracked-files=no", "--", *watched_paths())
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("BENCH_COMMIT") or None  # a copy of the tree without its .git, e.g. on a GPU machine
    return sha + ("-dirty" if changed else "")


def cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for key in ("model name", "Model", "Hardware", "cpu model"):  # x86, then ARM and others
        for line in lines:
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or None


def cpu_isa() -> str | None:
    """The vector instruction sets that decide CPU matmul speed: the widest torch's kernels use here (its
    "CPU capability") and the AVX-512 / bf16 / AMX flags the CPU reports. Machines sold under one model
    name ("AMD EPYC") differ here by 2x and more, so results are comparable only where this matches."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    found = [f for f in wanted if f in flags]
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        capability = None
    parts = ([f"torch kernels {capability}"] if capability else []) + ([" ".join(found)] if found else [])
    return ", ".join(parts) or None


def ram_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def os_name() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME") or platform.platform()
    except OSError:
        return platform.platform()


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def rlhfkit_version() -> str | None:
    """The installed distribution's version; the package's ``__version__`` when it is not installed."""
    try:
        return metadata.version("rlhfkit")
    except metadata.PackageNotFoundError:
        pass
    try:
        import rlhfkit
    except ImportError:
        return None
    return getattr(rlhfkit, "__version__", None)


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "isa": cpu_isa(),
        "logical_cores": os.cpu_count(),
        "ram_gib": ram_gib(),
        "os": os_name(),
        "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "torch": torch_version(),
        "rlhfkit": rlhfkit_version(),
    }


def load_warning(start: list[float] | None) -> str | None:
    if not start or start[0] <= BUSY_LOAD:
        return None
    return (
        f"1-minute load average {start[0]:.2f} > {BUSY_LOAD:g} at the start: the machine was busy, "
        "the timings are suspect"
    )


class Stamp:
    """Taken at the start of a run (the start load is read first, before anything else runs)."""

    def __init__(self) -> None:
        self.load_start = load_average()
        self.date = utc_now()
        self.commit = git_commit()
        self.machine = machine()

    def record(self) -> dict:
        """The stamp as written into a result; its end load is read now."""
        return {
            "commit": self.commit,
            "date": self.date,
            "machine": self.machine,
            "load": {"start": self.load_start, "end": load_average(), "warning": load_warning(self.load_start)},
        }


def summary(stamp: dict | None) -> str:
    """One line: commit, date, machine, load at the start and at the end, and the warning if any."""
    if not stamp:
        return "stamp: none (this result predates stamping)"
    commit = stamp.get("commit") or "no git commit"
    sha, dirty = commit.removesuffix("-dirty"), commit.endswith("-dirty")
    parts = [f"stamp: {sha[:12]}{'-dirty' if dirty else ''}", str(stamp.get("date"))]
    m = stamp.get("machine") or {}
    if m:
        ram = m.get("ram_gib")
        parts.append(
            f"{m.get('cpu') or '?'}{' (' + m['isa'] + ')' if m.get('isa') else ''}, {m.get('logical_cores') or '?'} cores, "
            f"{'?' if ram is None else ram} GiB, {m.get('os') or '?'} ({m.get('kernel') or '?'}), "
            f"Python {m.get('python') or '?'}, torch {m.get('torch') or '?'}, rlhfkit {m.get('rlhfkit') or '?'}"
        )
    load = stamp.get("load") or {}
    if load:
        fmt = lambda xs: "/".join(f"{x:.2f}" for x in xs) if xs else "?"  # noqa: E731
        parts.append(f"load 1/5/15 min {fmt(load.get('start'))} -> {fmt(load.get('end'))}")
        if load.get("warning"):
            parts.append(f"warning: {load['warning']}")
    if stamp.get("note"):
        parts.append(stamp["note"])
    return "; ".join(parts)
