"""A benchmark's result file: one JSON file per benchmark (bench/reported/ppo_vs_trl.json, grpo_vs_trl.json,
profile_ppo.json) holding each of its runs, filed under the machine that measured it and the commit and options
it measured:

    {"benchmark": "ppo_vs_trl",
     "machines": {
       "<machine key>": {
         "<run key>": {"stamp": ..., "args": ..., "settings": ..., <the run's numbers>},
         ...},
       ...}}

machine key  "<CPU model>; <instruction sets>; <N> cores", from the run's stamp (bench/stamp.py), e.g.
             "AMD EPYC; torch kernels AVX2, avx2; 2 cores". One model name covers CPUs whose matmul rates differ
             by 2-4x, so timings compare only under one key. A run whose stamp records no CPU (it predates
             stamping) carries the key in its stamp's "machine_key", with "machine_key_source" saying where it
             comes from.
run key      the commit (12 characters, "-dirty" kept) and the command-line options that differ from the
             script's defaults, e.g. "30d9947d964f --sizes tiny --repeats 5 --skip-trl --compile-decode ''".

Saving a run merges it into the file: a run with the same machine and run key (the same measurement made again)
replaces the earlier one, which git history keeps; every other run stays as it is. A run is stored without the
paths of the machine that made it (``portable``): a path inside the repository becomes relative to it, one in a
Python environment's site-packages starts at ``site-packages/``, one in the home folder at ``~/``, and any other
keeps its last two parts after ``…/``. Standard library only, so bench/tables.py and the tests read these files
without torch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Options that say where files go or what is printed, not what is measured: left out of run keys.
NOT_SETTINGS = ("out", "work_dir", "report", "run", "torch_profile")


# An absolute POSIX path inside a string: a "/" that starts the string or follows a space, quote, "=", ",", ":" or
# "(", then at least two parts ("/x" alone, "1/5/15" or "s/step" are not paths).
ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[\s'\"=,:(]))/[\w.+@~-]+(?:/[\w.+@~-]+)+/?")
# a relative path into a Python environment (a venv's lib/pythonX.Y/site-packages/...), up to site-packages/
ENVIRONMENT = re.compile(r"(?:(?<=^)|(?<=[\s'\"=,:(]))[\w.+@~-]+(?:/[\w.+@~-]+)*/site-packages/")
SYSTEM = ("/dev/", "/proc/", "/sys/", "/usr/", "/etc/", "/bin/")  # the same on every machine: kept


def portable_path(path: str, roots: Iterable[str] = (), home: str | None = None) -> str:
    """``path`` (absolute) without what is particular to the machine: relative to the repository (``roots``: the
    checkouts it may be in; this one by default), from ``site-packages/`` on in a Python environment, from ``~/``
    in the home folder (``home``, default this user's), else ``…/`` and its last two parts."""
    if path.startswith(SYSTEM):
        return path
    home = home if home is not None else str(Path.home())
    parts = path.rstrip("/").split("/")
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages") :])
    for root in (*roots, str(ROOT)):
        root = root.rstrip("/")
        if path == root:
            return "."
        if path.startswith(root + "/"):
            return path[len(root) + 1 :]
    if home not in ("", "/") and path.startswith(home.rstrip("/") + "/"):
        return "~/" + path[len(home.rstrip("/")) + 1 :]
    return "…/" + "/".join(parts[-2:])


def portable(value, roots: Iterable[str] = (), home: str | None = None):
    """``value`` (a run, a key: any JSON value) with every absolute path in its strings, keys included, made
    ``portable_path``."""
    roots = tuple(roots)
    if isinstance(value, str):
        value = ABSOLUTE.sub(lambda m: portable_path(m.group(0), roots, home), value)
        return ENVIRONMENT.sub("site-packages/", value)
    if isinstance(value, dict):
        return {portable(k, roots, home): portable(v, roots, home) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, roots, home) for v in value]
    return value


def machine_key(stamp: dict) -> str:
    if stamp.get("machine_key"):
        return stamp["machine_key"]
    m = stamp.get("machine") or {}
    cores = m.get("logical_cores")
    return "; ".join(
        [m.get("cpu") or "CPU not recorded", m.get("isa") or "instruction sets not recorded", f"{cores or '?'} cores"]
    )


def option_text(args: dict, defaults: dict) -> str:
    """The options in ``args`` that differ from ``defaults``, written as on the command line, in ``args``' order."""
    parts = []
    for name, value in args.items():
        if name in NOT_SETTINGS or value == defaults.get(name):
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif value is not False and value is not None:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


def run_key(commit: str | None, args: dict, defaults: dict) -> str:
    sha = commit or "no-commit"
    short = sha.removesuffix("-dirty")[:12] + ("-dirty" if sha.endswith("-dirty") else "")
    return portable(" ".join(x for x in (short, option_text(args, defaults)) if x))


def read(path: Path, benchmark: str | None = None) -> dict:
    """The file at ``path`` (an empty one when there is none). A file that holds a single run in the layout of
    before, a result with its ``stamp`` at the top, is read as that one run, keyed by its commit and date."""
    path = Path(path)
    if not path.exists():
        return {"benchmark": benchmark, "machines": {}}
    data = json.loads(path.read_text())
    if "machines" not in data and "stamp" in data:
        stamp = data["stamp"] or {}
        key = f"{run_key(stamp.get('commit'), {}, {})} ({stamp.get('date')})"
        return {"benchmark": benchmark, "machines": {machine_key(stamp): {key: data}}}
    return data


def write(path: Path, data: dict) -> None:
    """Write ``data`` whole, ``portable``, through a temporary file, so an interrupted write leaves the previous
    file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(portable(json.loads(json.dumps(data, default=str))), indent=1) + "\n")
    os.replace(tmp, path)


def merge(path: Path, benchmark: str, machine: str, key: str, run: dict) -> None:
    """Put ``run`` into the file under ``machine`` / ``key``, keeping every other run there (the file is written
    ``portable``, its key too)."""
    data = read(path, benchmark)
    data["benchmark"] = data.get("benchmark") or benchmark
    data.setdefault("machines", {}).setdefault(machine, {})[key] = run
    write(path, data)


def runs(data: dict) -> Iterator[tuple[str, str, dict]]:
    """(machine key, run key, run) for every run in a file's data, in file order."""
    for machine, by_key in data.get("machines", {}).items():
        for key, run in by_key.items():
            yield machine, key, run


def select(data: dict, text: str | None) -> list[tuple[str, str, dict]]:
    """The runs whose "machine key / run key" contains ``text`` (every run when ``text`` is empty)."""
    return [(m, k, r) for m, k, r in runs(data) if not text or text in f"{m} / {k}"]


def add_report_options(ap) -> None:
    """A benchmark's ``--report FILE`` and ``--run TEXT``: print the tables of runs already in a file."""
    ap.add_argument("--report", metavar="RESULTS.json", help="only print the tables of the runs in a JSON file")
    ap.add_argument("--run", metavar="TEXT", help="with --report: only the runs whose machine / run key has TEXT")


def parse_or_report(ap, argv: list[str] | None, print_table):
    """A benchmark's arguments, with its ``--report`` / ``--run`` options added; with ``--report`` the tables of
    the file's runs are printed instead and None is returned."""
    add_report_options(ap)
    args = ap.parse_args(argv)
    if args.report:
        print_report(Path(args.report), args.run, print_table)
        return None
    return args


def print_report(path: Path, text: str | None, print_table) -> None:
    """``print_table(run)`` for each run of the file at ``path`` that ``select`` picks, under its machine and key."""
    for machine, key, run in select(read(path), text):
        print(f"\n== {machine} / {key}")
        print_table(run)


def main(argv: list[str] | None = None) -> int:
    """Rewrite result files in place, ``portable``: ``python bench/results_file.py bench/reported/NAME.json ...``."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    for path in ap.parse_args(argv).files:
        write(path, read(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
