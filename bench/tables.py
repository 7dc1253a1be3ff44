"""The result tables of the README and docs/, rendered from bench/reported/*.json.

    python -m bench.tables           # rewrite the tables in the docs (also: python bench/tables.py)
    python -m bench.tables --check   # exit 1, with a diff, where a doc's table differs from what the files give

A doc marks each table it shows with a comment before it and one after it; what lies between is replaced:

    <!-- table:speed -->
    | benchmark | model | ... |
    <!-- end -->

Each table below reads the runs of named selections of bench/tables.json (bench/report/parts.py: per selection a
result file, a machine and a rule such as "the newest run"), so a table changes only when its runs change or
its selection does. Below each table a line names its files, runs and selections. Standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

if not __package__:  # run as a script: the repository root on the path, as with python -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import choices, demo, generation, iterate, judge, performance
from bench.report.parts import ROOT

DOCS = [
    ROOT / "README.md",
    ROOT / "docs" / "performance.md",
    ROOT / "docs" / "concepts.md",
    ROOT / "docs" / "demo.md",
    ROOT / "docs" / "demo-models.md",
    ROOT / "docs" / "tuning-ppo.md",
    ROOT / "docs" / "generation.md",
    ROOT / "docs" / "iterated.md",
    ROOT / "docs" / "judge.md",
    ROOT / "docs" / "real-models.md",
]
MARKER = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- end -->)", re.S)

TABLES: dict[str, Callable[[], list[str]]] = {
    # performance.md and the README
    "speed": performance.speed,
    "speed_readme": lambda: performance.speed(compact=True),
    "learning": performance.learning,
    "real_memory": performance.real_memory,
    "real_gpu": performance.real_gpu,
    "pieces": performance.pieces,
    # concepts.md
    "loss_aggregation": lambda: choices.loss_aggregation("loss_aggregation"),
    # demo.md
    "demo_tiny": lambda: demo.demo_gains("demo/tiny"),
    "demo_stage_times": lambda: demo.demo_stage_times("demo/tiny"),
    "dpo_beta_gold": lambda: choices.dpo_beta_gold("dpo_beta/tiny"),
    # demo-models.md
    "rm_lora": lambda: choices.rm_lora("rm_lora"),
    "rm_headroom": lambda: choices.rm_headroom("rm_headroom"),
    "rl_knobs": lambda: choices.rl_knobs("rl_knobs"),
    "rl_knobs_labels": lambda: choices.rl_knobs("rl_knobs/labels"),
    "demo_smol": lambda: demo.demo_gains("demo/smollm2", kl=True),
    "demo_smol_stage_times": lambda: demo.demo_stage_times("demo/smollm2"),
    "demo_smol_rounds": lambda: demo.demo_rounds("demo/smollm2"),
    "demo_smol_dpo_beta": lambda: choices.dpo_beta("dpo_beta/smollm2"),
    "demo_smol_with_critic": lambda: demo.demo_gains("demo/smollm2-critic", kl=True),
    "demo_smol_critic": lambda: choices.ppo_critic("ppo_critic", "demo/smollm2-critic"),
    # real-models.md
    "adapter_load": lambda: choices.adapter_load("adapter_load"),
    "demo_smol_threads": lambda: demo.demo_two_ways(
        ("demo/smollm2-threads-2", "demo/smollm2-threads-1"), ("--threads 2", "--threads 1")
    ),
    # generation.md
    "vllm_engine": lambda: generation.vllm_engine("vllm_engine"),
    "vllm_learning": lambda: generation.vllm_learning("vllm_learning/epyc", "vllm_learning/xeon"),
    "vllm_learning_number": lambda: generation.vllm_learning("vllm_learning/number"),
    # iterated.md, judge.md
    "iterate_tasks": lambda: iterate.iterate_tasks("iterate_tasks"),
    "iterate_carry": lambda: iterate.iterate_tasks("iterate_tasks/carry"),
    "judge": lambda: judge.judge("judge"),
}


def render(text: str, where: str) -> str:
    def one(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise SystemExit(f"tables: {where} marks an unknown table {name!r}; known: {', '.join(TABLES)}")
        return match.group(1) + "\n".join(TABLES[name]()) + "\n" + match.group(4)

    return MARKER.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where a doc differs from the files")
    ap.add_argument("docs", nargs="*", type=Path, default=DOCS, help="the docs with marked tables")
    args = ap.parse_args(argv)
    stale, shown = [], set()
    for doc in args.docs:
        text = doc.read_text()
        shown.update(name for _, name, _, _ in MARKER.findall(text))
        where = doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else str(doc)
        if text.count("<!-- table:") != len(MARKER.findall(text)):
            raise SystemExit(f"tables: {where} has a table marker without its <!-- end -->")
        new = render(text, where)
        if new == text:
            continue
        stale.append(where)
        if args.check:
            sys.stdout.writelines(
                difflib.unified_diff(
                    text.splitlines(True), new.splitlines(True), where, where + " (from bench/reported)"
                )
            )
        else:
            doc.write_text(new)
    unshown = [name for name in TABLES if name not in shown]
    if args.docs == DOCS and unshown:
        print(f"tables: no doc shows {', '.join(unshown)} (a marker was removed?)", file=sys.stderr)
        return 1
    if args.check and stale:
        print(f"\ntables: {', '.join(stale)} differ from bench/reported; run: python -m bench.tables", file=sys.stderr)
        return 1
    if stale and not args.check:
        print(f"tables: rewrote {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
