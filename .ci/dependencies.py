#!/usr/bin/env python3
"""The tested dependency set (constraints.txt) and the suite against the newest releases.

    python3 .ci/dependencies.py freeze VENV      # rewrite constraints.txt from what VENV has installed
    python3 .ci/dependencies.py latest          # make test-latest: a fresh .venv-latest with the newest
                                                # releases, the suite (TESTS=paths: only those), and the
                                                # upgrade behind each failure

`latest` installs torch as `make install` does (TORCH_VERSION, TORCH_INDEX) and everything else unpinned,
lists what differs from constraints.txt, runs the suite, and when tests fail takes the upgrades one at a time:
it puts that one package back to its tested version (`pip install --no-deps`), runs the failed tests again,
and reports the upgrade whose rollback makes a test pass as the one that broke it. Exit status: 0 when the
suite passes on the newest releases, 1 when it does not. Standard library only (runs before any venv exists).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
HEADER = """\
# The exact versions the test suite last passed on, used by `make install`, `make test` and `make demo`.
# Recorded on {where}.
# The package's own requirements (pyproject.toml) stay ranges, so `pip install rlhfkit` takes newer
# releases. `make test-latest` runs the suite against the newest releases and names the upgrade behind each
# failure; `make constraints` rewrites this file from .venv once the suite passes there. torch is pinned by
# the Makefile (TORCH_VERSION), not here, so a CUDA build already installed is kept.
"""
NOT_PINNED = {"torch", "rlhfkit"}  # torch: the Makefile's TORCH_VERSION; rlhfkit: this checkout


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, tuple[str, str]]:
    """``name==version`` lines (comments and other lines skipped) -> {canonical name: (name, version)}."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = (part.strip() for part in line.split("==", 1))
            pins[canonical(name)] = (name, version.split(";")[0].strip())
    return pins


def frozen(python: Path) -> dict[str, tuple[str, str]]:
    out = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--exclude-editable"], check=True, capture_output=True, text=True
    ).stdout
    return {k: v for k, v in parse_pins(out).items() if k not in NOT_PINNED}


def upgrades(tested: dict, latest: dict) -> list[tuple[str, str | None, str | None]]:
    """(name, tested version, newest version) of every package that differs, the package's direct
    requirements first (they are the likelier cause), then the rest by name. None: absent on that side."""
    direct = {canonical(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0]) for r in _requirements()}
    changed = [
        (latest.get(k, tested.get(k))[0], tested.get(k, (None, None))[1], latest.get(k, (None, None))[1])
        for k in sorted(set(tested) | set(latest))
        if tested.get(k, (None, None))[1] != latest.get(k, (None, None))[1]
    ]
    return sorted(changed, key=lambda c: (canonical(c[0]) not in direct, canonical(c[0])))


def _requirements() -> list[str]:
    """The package's requirements and its test extras, as written in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = []
    for block in re.findall(r"^(?:dependencies|test) = \[(.*?)\]", text, flags=re.S | re.M):
        found += re.findall(r'"([^"]+)"', re.sub(r"#.*", "", block))
    return found


def write_constraints(pins: dict[str, tuple[str, str]], where: str) -> None:
    lines = [f"{name}=={version}" for _, (name, version) in sorted(pins.items())]
    CONSTRAINTS.write_text(HEADER.format(where=where) + "\n".join(lines) + "\n", encoding="utf-8")


def failed_tests(junit: Path) -> list[str]:
    """Node ids of the failed or erroring tests in a pytest JUnit XML report."""
    failed = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname", "").replace(".", "/")
            # classname is dotted module path (plus a class, if any); rebuild a pytest node id
            path = module + ".py"
            if not (ROOT / path).is_file() and "/" in module:
                head, cls = module.rsplit("/", 1)
                path = f"{head}.py::{cls}"
            failed.append(f"{path}::{case.get('name')}")
    return failed


def blame(failed: list[str], changed, pip_install, run_tests) -> dict[str, list[str]]:
    """Which upgrade broke which test: for each upgraded package in turn, put the tested version back,
    run the still-unexplained failures, and restore the newest version. Returns {"name old -> new": tests};
    tests no single rollback fixes are listed under "no single upgrade"."""
    unexplained, found = list(failed), {}
    for name, tested, newest in changed:
        if not unexplained:
            break
        if tested is None or newest is None:
            continue  # a package added or dropped: no version to go back to
        pip_install(f"{name}=={tested}")
        try:
            still = set(run_tests(unexplained))
        finally:
            pip_install(f"{name}=={newest}")
        fixed = [t for t in unexplained if t not in still]
        if fixed:
            found[f"{name} {tested} -> {newest}"] = fixed
            unexplained = [t for t in unexplained if t in still]
    if unexplained:
        found["no single upgrade (several together, or the machine)"] = unexplained
    return found


def latest() -> int:
    venv = ROOT / ".venv-latest"
    python = venv / "bin" / "python"
    torch_version = os.environ.get("TORCH_VERSION", "2.13.0")
    index = os.environ.get("TORCH_INDEX", "")
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "-q"]
    run([*pip, "--upgrade", "pip"])
    run([*pip, f"torch=={torch_version}", *(["--index-url", index] if index else [])])
    # every other package at its newest release; torch held where it is (an upgrade would pull CUDA wheels)
    hold = venv / "torch-held.txt"
    hold.write_text(f"torch=={_version(python, 'torch')}\n")
    run([*pip, "-c", str(hold), "-e", f"{ROOT}[test]"])

    tested = {k: v for k, v in parse_pins(CONSTRAINTS.read_text()).items() if k not in NOT_PINNED}
    changed = upgrades(tested, frozen(python))
    print("\nnewest releases against constraints.txt:")
    for name, old, new in changed:
        print(f"  {name:<28} {old or '(not in the tested set)':>14} -> {new or '(no longer installed)'}")
    if not changed:
        print("  none: the tested set is the newest")

    junit = venv / "junit.xml"

    def run_tests(tests: list[str], report: Path = junit) -> list[str]:
        cmd = [str(python), "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests]
        subprocess.run(cmd, cwd=ROOT)
        return failed_tests(report)

    print("\nthe suite on the newest releases:", flush=True)
    failed = run_tests(os.environ.get("TESTS", "tests").split())
    if not failed:
        print("\nthe suite passes on the newest releases; `make constraints VENV=.venv-latest` records them")
        return 0
    print(f"\n{len(failed)} test(s) fail on the newest releases; rolling back one upgrade at a time:", flush=True)
    pip_install = lambda spec: run([*pip, "--no-deps", spec])  # noqa: E731
    found = blame(failed, changed, pip_install, lambda tests: run_tests(tests, venv / "junit-blame.xml"))
    print("\nwhat broke what:")
    for cause, tests in found.items():
        print(f"  {cause}:")
        for test in tests:
            print(f"    {test}")
    return 1


def _version(python: Path, package: str) -> str:
    code = f"from importlib.metadata import version; print(version('{package}'))"
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, cwd=ROOT)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "freeze":
        python = Path(argv[1]) / "bin" / "python"
        where = f"Python {_version_of_python(python)}, {os.uname().sysname} {os.uname().machine}, torch " + _version(
            python, "torch"
        )
        write_constraints(frozen(python), where)
        print(f"wrote {CONSTRAINTS} from {argv[1]}")
        return 0
    if argv == ["latest"]:
        return latest()
    print(__doc__, file=sys.stderr)
    return 2


def _version_of_python(python: Path) -> str:
    code = "import platform; print(platform.python_version())"
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
