"""What the README and docs say about the demo and the benchmarks agrees with the code and the reported runs: the
demo's time, its stages, DPO's β; every benchmark and bench/ file a page names exists; and no tracked file holds a
path of the machine that wrote it."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from bench import suite
from bench.report.parts import select

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]

# A stage of the demo's plan (rlhfkit.demo.plan) -> the name the README, the demo's summary and the report give it.
STAGE_NAMES = {
    "sft": "SFT",
    "rm": "reward model",
    "ppo": "PPO",
    "dpo": "DPO",
    "iterate": "iterated PPO",
    "online_dpo": "online DPO",
}
NO_KL = "PPO without KL"


def demo_stages() -> list[str]:
    """The stages the built-in demo runs, by name (a stage this test does not know fails it: name it here and in
    the docs)."""
    from rlhfkit.demo.plan import plan

    run_plan = plan(False)
    unknown = set(run_plan.settings) - set(STAGE_NAMES)
    assert not unknown, f"the demo's plan has stages {unknown} that the docs do not name"
    return [STAGE_NAMES[stage] for stage in run_plan.settings] + ([NO_KL] if run_plan.no_kl_steps else [])


def minutes(text: str) -> float:
    """ "7½" -> 7.5."""
    return float(text.rstrip("½")) + (0.5 if text.endswith("½") else 0.0)


def test_the_demos_time_is_what_the_reported_runs_took():
    (run,) = select("demo/tiny")
    took = statistics.mean(seed["seconds"] / 60 for seed in run["seeds"].values())
    for page in (ROOT / "README.md", ROOT / "docs" / "demo.md"):
        stated = re.findall(r"about (\d+½?) minutes", page.read_text())
        assert stated, f"{page.name} does not say how long the demo takes"
        assert abs(minutes(stated[0]) - took) <= 0.5, (
            f"{page.name} says the demo takes about {stated[0]} minutes; the reported runs took {took:.1f}"
        )


def test_the_demos_stages_are_the_ones_it_runs():
    from rlhfkit.commands import COMMANDS

    stages = demo_stages()
    readme = ROOT.joinpath("README.md").read_text()
    make_demo = next(line for line in readme.splitlines() if line.startswith("make demo"))
    summary = COMMANDS["demo"].summary
    for name in stages:
        assert re.search(rf"\b{re.escape(name)}\b", make_demo), f"README's `make demo` line leaves out {name}"
        assert re.search(rf"\b{re.escape(name)}\b", summary), f"`rlhfkit demo`'s summary leaves out {name}"
    (run,) = select("demo/tiny")  # the runs docs/demo.md shows ran every stage of the plan
    for seed, got in run["seeds"].items():
        missing = [n for n in stages if not any(s.startswith(n) for s in got["stage_seconds"])]
        assert not missing, f"the reported demo run (seed {seed}) has no stage {missing}: run the demo again"


def test_dpos_beta_is_the_plans():
    from rlhfkit.demo.plan import plan

    beta = plan(False).settings["dpo"]["beta"]
    demo = ROOT.joinpath("docs", "demo.md").read_text()
    row = next(line for line in demo.splitlines() if line.startswith("| 7. DPO |"))
    assert f"β = {beta:g}" in row, f"docs/demo.md's DPO stage gives another β than the plan's {beta:g}"
    assert f"β = {beta:g}" in ROOT.joinpath("README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_benchmarks_a_page_names_exist(page):
    text = page.read_text(encoding="utf-8")
    stale = [name for name in re.findall(r"python -m bench ([a-z_]+)\b", text) if name not in suite.BY_NAME]
    stale += [p for p in re.findall(r"\bbench/[a-z0-9_./-]+\.(?:py|sh|json|md)\b", text) if not (ROOT / p).exists()]
    stale += [m for m in re.findall(r"python -m (bench(?:\.\w+)+)", text) if not module_exists(m)]
    assert not stale, f"{page.relative_to(ROOT)} names what bench/ does not have: {stale}"


def module_exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


# An absolute path in a user's or a machine's own folders, or into a Python environment's lib/pythonX.Y.
MACHINE_PATH = re.compile(
    r"(?<![\w.~/-])/(?:work|root|home|tmp|Users|mnt|scratch|private)/[\w.-]+"
    r"|\.venv[\w-]*/lib/python3\.\d+"
    r"|[A-Z]:\\+Users\\+"
)


# the tests of that check, whose data are such paths
TEST_DATA = {"tests/test_docs_current.py", "tests/test_bench_results.py"}


def test_no_tracked_file_holds_a_path_of_the_machine_that_wrote_it():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git work tree")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    found = []
    for name in listed:
        path = ROOT / name
        if name in TEST_DATA or not path.is_file() or path.suffix in (".png", ".jpg", ".gguf", ".safetensors", ".bin"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in MACHINE_PATH.finditer(line):
                found.append(f"{name}:{number}: {match.group(0)}")
    assert not found, "machine paths (bench/results_file.py's portable() rewrites result files):\n" + "\n".join(
        found[:20]
    )


def test_the_machine_path_check_can_fail():
    assert MACHINE_PATH.search('"out": "/tmp/x.json"') and MACHINE_PATH.search("--demo-dir /work/demo/seed0")
    assert MACHINE_PATH.search(".venv/lib/python3.11/site-packages/x")
    for kept in ("/dev/shm", "/usr/bin/chromium", "/proc/cpuinfo", "bench/results/work", "~/.cache/rlhfkit"):
        assert not MACHINE_PATH.search(kept), kept
