"""The result tables of docs/performance.md, README.md and docs/concepts.md, rendered from bench/reported/*.json.

    python bench/tables.py           # rewrite the tables in the docs
    python bench/tables.py --check   # exit 1, with a diff, where a doc's table differs from what the files give

A doc marks each table it shows with a comment before it and one after it; what lies between is replaced:

    <!-- table:ppo_vs_trl_avx2 -->
    | size | run | ... |
    <!-- end -->

Each name in TABLES picks its runs by file, machine key and run key (bench/results_file.py), so a table changes
only when its runs change or when it is pointed at other runs. Below each table a line names its runs.
Standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import re
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
REPORTED = BENCH / "reported"
DOCS = [ROOT / "docs" / "performance.md", ROOT / "README.md", ROOT / "docs" / "concepts.md"]
WIDTH = 110  # the docs' line width, for the text under a table
MARKER = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- end -->)", re.S)

AVX2 = "AMD EPYC; torch kernels AVX2, avx2; 2 cores"
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


def sources(*runs: Run) -> str:
    """The line under a table: each file, its machines and the run keys used."""
    by_place: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        keys = by_place.setdefault((run.file, run.machine), [])
        if run.key not in keys:
            keys.append(run.key)
    parts = [
        f"`{file}`, {machine}: run{'s' if len(keys) > 1 else ''} " + ", ".join(f"`{k}`" for k in keys)
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


def trl_name(runs: list[dict]) -> str:
    return "TRL " + ".".join(str(runs[0].get("version", "")).split(".")[:2])


# ---- PPO against TRL ---------------------------------------------------------------------------------
def ppo_rows(run: Run, bf16: bool = False) -> list[list]:
    rows = []
    lora_r = run["args"]["lora_r"]
    for size, res in run["sizes"].items():
        before = res["before"]
        for name, runs in res["runs"].items():
            label = {"rlhfkit": "rlhfkit", "rlhfkit-lora": f"rlhfkit LoRA r={lora_r}"}.get(name) or trl_name(runs)
            if bf16:
                label += " bf16=True" if name == "trl" else " bf16"
            gold = [r["eval"]["gold"] - before["gold"] for r in runs]
            rm = [r["eval"]["rm_score"] - before["rm_score"] for r in runs]
            step = [r["step_s"] for r in runs]
            speed = [] if bf16 else [pm(mean_std([r["tokens_per_s"] for r in runs]), 0)]
            rss = pm(mean_std([r["peak_rss_mb"] for r in runs]), 0)
            rows.append(
                [size, label, pm(mean_std(step)), f"{min(step):.2f}", *speed, rss, pm(mean_std(gold)), pm(mean_std(rm))]
            )
        if not bf16 and res.get("sft_footprint"):
            sft = pm(mean_std([r["peak_rss_mb"] for r in res["sft_footprint"]]), 0)
            rows.append([size, "one model's SFT", "", "", "", sft, "", ""])
    return rows


def ppo_table(benchmark: str, machine: str, key: str, bf16: bool = False) -> list[str]:
    run = Run(benchmark, machine, key)
    columns = ["s/step", "best"] + ([] if bf16 else ["tokens/s"]) + ["peak RSS MB", "gold gain", "RM gain"]
    return [*table(["size", "run", *columns], ppo_rows(run, bf16)), "", sources(run)]


def ppo_baseline() -> list[str]:
    """The rlhfkit rows of two commits run one after the other on one machine."""
    current = Run("ppo_vs_trl", AVX2, "ded3a7111ca7")
    before = Run("ppo_vs_trl", AVX2, "0ff27bfc33e6 --lora-r 0 --skip-trl")
    rows = []
    for size in current["sizes"]:
        now = mean_std([r["step_s"] for r in current["sizes"][size]["runs"]["rlhfkit"]])[0]
        for run in (current, before):
            runs = run["sizes"][size]["runs"]["rlhfkit"]
            step = [r["step_s"] for r in runs]
            rows.append(
                [
                    size,
                    f"`{run['stamp']['commit'][:7]}`",
                    pm(mean_std(step)),
                    f"{min(step):.2f}",
                    f"{mean_std(step)[0] / now:.2f}",
                    pm(mean_std([r["peak_rss_mb"] for r in runs]), 0),
                ]
            )
    header = ["size", "rlhfkit at", "s/step", "best", "÷ current s/step", "peak RSS MB"]
    return [*table(header, rows), "", sources(current, before)]


def learning_parts(parts: list[tuple[Run, str]], size: str) -> tuple[list[tuple[int, dict]], dict]:
    """Final held-out scores of one framework over the seeds of several runs, in seed order; checks that the
    seeds do not repeat and that every run started from the same SFT policy scores."""
    seeds, befores = [], []
    for run, name in parts:
        seeds += run.seeds(size, name)
        befores.append(run["sizes"][size]["before"])
    numbers = [s for s, _ in seeds]
    if len(set(numbers)) != len(numbers):
        raise SystemExit(f"tables: a seed repeats in {[(r.key, n) for r, n in parts]}")
    for b in befores[1:]:
        if abs(b["gold"] - befores[0]["gold"]) > 1e-6 or abs(b["rm_score"] - befores[0]["rm_score"]) > 1e-6:
            raise SystemExit("tables: the runs of a learning table start from different SFT scores")
    return sorted(seeds, key=lambda x: x[0]), befores[0]


def seed_range(seeds: list[tuple[int, dict]]) -> str:
    numbers = [s for s, _ in seeds]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise SystemExit(f"tables: seeds {numbers} are not consecutive")
    return f"seeds {numbers[0]}–{numbers[-1]}"


def ahead(a: list[float], b: list[float]) -> str:
    return f"{sum(x > y for x, y in zip(a, b))} of {len(a)}"


def ppo_learning_tiny() -> list[str]:
    """Final RM and gold scores at tiny over every seed both frameworks ran, and over the last run's seeds."""
    base = Run("ppo_vs_trl", AVX512, "23affda37e5a")
    last = Run("ppo_vs_trl", AVX512, "10600cc43dc1 --sizes tiny --repeats 40 --lora-r 0 --seed 39")
    rlhfkit_3_38 = Run("ppo_vs_trl", AVX512, "10600cc43dc1 --sizes tiny --repeats 36 --lora-r 0 --seed 3 --skip-trl")
    trl_runs = [
        Run("ppo_vs_trl", AVX512, "9097a2248ee9 --sizes tiny --repeats 6 --lora-r 0 --seed 3"),
        Run("ppo_vs_trl", AVX512, "e2c85cd23086 --sizes tiny --repeats 10 --lora-r 0 --seed 9"),
        Run("ppo_vs_trl", AVX512, "5a07df0bb9ef --sizes tiny --repeats 20 --lora-r 0 --seed 19"),
    ]
    every = {
        "rlhfkit": learning_parts([(base, "rlhfkit"), (rlhfkit_3_38, "rlhfkit"), (last, "rlhfkit")], "tiny"),
        "trl": learning_parts([(base, "trl"), *((r, "trl") for r in trl_runs), (last, "trl")], "tiny"),
    }
    lasts = {name: learning_parts([(last, name)], "tiny") for name in ("rlhfkit", "trl")}
    all_range, last_range = seed_range(every["rlhfkit"][0]), seed_range(lasts["rlhfkit"][0])
    if seed_range(every["trl"][0]) != all_range:
        raise SystemExit("tables: rlhfkit and TRL cover different seeds")
    before = every["rlhfkit"][1]

    def scores(seeds, what):
        return [r["eval"][what] for _, r in seeds]

    rows = [["SFT policy", f"{before['rm_score']:.2f}", f"{before['gold']:.2f}", f"{before['gold']:.2f}"]]
    for name, label in (("rlhfkit", "rlhfkit"), ("trl", trl_name([r for _, r in every["trl"][0]]))):
        rows.append(
            [
                label,
                pm(mean_se(scores(every[name][0], "rm_score"))),
                pm(mean_se(scores(every[name][0], "gold"))),
                pm(mean_se(scores(lasts[name][0], "gold"))),
            ]
        )
    a, b = every["rlhfkit"][0], every["trl"][0]
    la, lb = lasts["rlhfkit"][0], lasts["trl"][0]
    rows.append(
        [
            "rlhfkit − TRL",
            pm(diff_se(scores(a, "rm_score"), scores(b, "rm_score")), sign="+"),
            pm(diff_se(scores(a, "gold"), scores(b, "gold")), sign="+"),
            pm(diff_se(scores(la, "gold"), scores(lb, "gold")), sign="+"),
        ]
    )
    rows.append(
        [
            "seeds where rlhfkit is ahead",
            ahead(scores(a, "rm_score"), scores(b, "rm_score")),
            ahead(scores(a, "gold"), scores(b, "gold")),
            ahead(scores(la, "gold"), scores(lb, "gold")),
        ]
    )
    header = ["tiny, 20 steps", f"RM score, {all_range}", f"gold, {all_range}", f"gold, {last_range}"]
    return [*table(header, rows), "", sources(base, rlhfkit_3_38, *trl_runs, last)]


def ppo_learning_small() -> list[str]:
    """Gold and RM gains at small over the seeds of two runs."""
    parts = [
        Run("ppo_vs_trl", AVX512, "23affda37e5a"),
        Run("ppo_vs_trl", AVX512, "a3da41932fc7 --sizes small --repeats 10 --lora-r 0 --seed 3"),
    ]
    got = {name: learning_parts([(r, name) for r in parts], "small") for name in ("rlhfkit", "trl")}
    gains = {
        name: {what: [r["eval"][what] - before[what] for _, r in seeds] for what in ("gold", "rm_score")}
        for name, (seeds, before) in got.items()
    }
    rows = [
        [label, pm(mean_se(gains[name]["gold"])), pm(mean_se(gains[name]["rm_score"]))]
        for name, label in (("rlhfkit", "rlhfkit"), ("trl", trl_name([r for _, r in got["trl"][0]])))
    ]
    rows.append(
        [
            "rlhfkit − TRL",
            pm(diff_se(gains["rlhfkit"]["gold"], gains["trl"]["gold"]), sign="+"),
            pm(diff_se(gains["rlhfkit"]["rm_score"], gains["trl"]["rm_score"]), sign="+"),
        ]
    )
    header = [f"small, 20 steps, {seed_range(got['rlhfkit'][0])}", "gold gain", "RM gain"]
    return [*table(header, rows), "", sources(*parts)]


# ---- GRPO against TRL --------------------------------------------------------------------------------
def grpo_table() -> list[str]:
    main = Run("grpo_vs_trl", AVX2, "30d9947d964f --seeds 10")
    eager = Run("grpo_vs_trl", AVX2, "30d9947d964f --sizes tiny --repeats 5 --compile-decode '' --skip-trl")
    compiled = {x.strip() for x in main["args"].get("compile_decode", "").split(",") if x.strip()}
    rows = []

    def add(run: Run, size: str, name: str, label: str) -> None:
        runs = run["sizes"][size]["runs"][name]
        step = [r["step_s"] for r in runs]
        rows.append(
            [
                size,
                label,
                len(runs),
                pm(mean_std(step), 3),
                f"{min(step):.3f}",
                pm(mean_std([r["tokens_per_s"] for r in runs]), 0),
                pm(mean_std([r["peak_rss_mb"] for r in runs]), 0),
                pm(mean_se([r["train_gain"] for r in runs]), sign="+"),
                pm(mean_se([r["heldout_gain"] for r in runs]), sign="+"),
            ]
        )

    for size, res in main["sizes"].items():
        for name, runs in res["runs"].items():
            label = "rlhfkit" if name == "rlhfkit" else trl_name(runs)
            if name == "rlhfkit" and size in compiled:
                label += ", `--compile-decode`"
            add(main, size, name, label)
            if name == "rlhfkit" and size in eager["sizes"]:
                add(eager, size, "rlhfkit", "rlhfkit, without it")
    header = ["size", "run", "seeds", "s/step", "best", "tokens/s", "peak RSS MB", "train gain", "held-out gain"]
    return [*table(header, rows), "", sources(main, eager)]


# ---- loss aggregation --------------------------------------------------------------------------------
def loss_aggregation_table() -> list[str]:
    """bench/loss_aggregation.py: held-out accuracy gained over SFT on the arithmetic task, per seed."""
    run = Run("loss_aggregation", AVX2, "1db0fc86a63f")
    seeds = list(run["seeds"])
    sft = [run["seeds"][s]["sft"] for s in seeds]
    rows = [
        [
            "SFT: its accuracy",
            "",
            " / ".join(f"{x['accuracy']:.3f}" for x in sft),
            "",
            f"{statistics.mean(x['reply_tokens'] for x in sft):.2f}",
        ]
    ]
    for name in run["seeds"][seeds[0]]["runs"]:
        got = [run["seeds"][s]["runs"][name] for s in seeds]
        command, aggregation = name.split(" ")
        rows.append(
            [
                command,
                f"`{aggregation}`",
                " / ".join(f"{g['gain']:+.3f}" for g in got),
                pm(mean_se([g["gain"] for g in got]), 3, sign="+"),
                f"{statistics.mean(g['reply_tokens'] for g in got):.2f}",
            ]
        )
    header = [
        "command",
        "--loss-aggregation",
        f"held-out accuracy gain over SFT, seeds {' / '.join(seeds)}",
        "mean ± s.e.",
        "reply tokens",
    ]
    return [*table(header, rows), "", sources(run)]


# ---- the speed summary ---------------------------------------------------------------------------------
def speed_rows(run: Run, benchmark: str, digits: int) -> list[list]:
    rows = []
    for size, res in run["sizes"].items():
        mine, trl = res["runs"]["rlhfkit"], res["runs"]["trl"]
        step_a = mean_std([r["step_s"] for r in mine])[0]
        step_b = mean_std([r["step_s"] for r in trl])[0]
        rss_a = mean_std([r["peak_rss_mb"] for r in mine])[0]
        rss_b = mean_std([r["peak_rss_mb"] for r in trl])[0]
        params = res["models"]["params"] / 1e6
        rows.append(
            [
                f"{benchmark} against {trl_name(trl)}",
                f"{size} ({params:.2f}M)",
                cpu_label(run.machine),
                len(mine),
                f"{step_a:.{digits}f}",
                f"{step_b:.{digits}f}",
                f"**{step_b / step_a:.2f}×**",
                f"{rss_a / rss_b:.2f}",
            ]
        )
    return rows


def speed(compact: bool = False) -> list[str]:
    """TRL's mean seconds per step over rlhfkit's, per benchmark, model size and machine. ``compact``: without
    the step times and the runs' names (the README's version; this page's names the runs)."""
    ppo_avx2 = Run("ppo_vs_trl", AVX2, "ded3a7111ca7")
    ppo_avx512 = Run("ppo_vs_trl", AVX512, "23affda37e5a")
    grpo = Run("grpo_vs_trl", AVX2, "30d9947d964f --seeds 10")
    runs = (ppo_avx512, ppo_avx2, grpo)
    if any(run["args"].get("bf16") for run in runs):
        raise SystemExit("tables: the speed table compares fp32 runs")
    rows = speed_rows(ppo_avx512, "PPO", 2) + speed_rows(ppo_avx2, "PPO", 2) + speed_rows(grpo, "GRPO", 3)
    real, _, real_runs = real_rows()
    for name, benchmark in (("ppo", "PPO"), ("ppo-lora", "PPO"), ("grpo", "GRPO"), ("grpo-lora", "GRPO")):
        if name not in real:
            continue
        mine, trl = real[name]["rlhfkit"], real[name]["trl"]
        step_a, step_b = (mean_std([r["step_s"] for r in x])[0] for x in (mine, trl))
        rss_a, rss_b = (mean_std([r["peak_rss_mb"] for r in x])[0] for x in (mine, trl))
        params = real_runs[0]["models"]["params"] / 1e6
        lora = ", LoRA r=16" if name.endswith("lora") else ""
        rows.append(
            [
                f"{benchmark} against {trl_name(trl)}",
                f"SmolLM2-135M ({params:.1f}M){lora}",
                cpu_label(REAL_MACHINE),
                len(mine),
                f"{step_a:.1f}",
                f"{step_b:.1f}",
                f"**{step_b / step_a:.2f}×**",
                f"{rss_a / rss_b:.2f}",
            ]
        )
    runs = (*runs, *real_runs)
    header = ["benchmark", "model", "CPU", "seeds", "rlhfkit s/step", "TRL s/step", "speed-up", "peak RSS ÷ TRL's"]
    threads = sorted({run["machine"]["threads"] for run in runs})
    compiled = grpo["args"].get("compile_decode")
    note = (
        f"fp32, {'/'.join(map(str, threads))} threads; speed-up: TRL's seconds per step ÷ rlhfkit's (each run's "
        "median step time, mean over its seeds)"
        + "; SmolLM2: 16 completions of 32 tokens per step, PPO with one epoch"
        + (" (docs/performance.md)" if compact else " (see [below](#a-real-model-smollm2-135m-instruct))")
        + (f"; GRPO's rlhfkit runs at {compiled} sample with `--compile-decode`." if compiled else ".")
    )
    if compact:
        keep = [0, 1, 2, 6, 7]
        return [*table([header[i] for i in keep], [[r[i] for i in keep] for r in rows]), "", wrap(note)]
    return [*table(header, rows), "", wrap(note), sources(*runs)]


# ---- the real model (bench/real_model.py) ------------------------------------------------------------------
REAL_MACHINE = "AMD EPYC; torch kernels AVX512, avx2 avx512f avx512_bf16; 2 cores"
REAL_RUNS = [  # in order: a later run's repeat of a row replaces an earlier one of the same seed
    "a2a57db89074-dirty",
    "333e14c097d8 --rows 'sft,dpo,sft vocab-chunk-off,sft checkpointing,dpo checkpointing,rm checkpointing,ppo "
    "vocab-chunk-off,ppo checkpointing'",
    "c77d13f88f7e-dirty --repeats 2 --seed 1 --rows grpo,ppo,grpo-lora,ppo-lora",
    "89da4d6c93b6 --rows 'grpo accel-off'",
    "64d84b18f0f6 --rows 'rm,rm checkpointing' --skip-trl --max-wait 0.0",
    "45806460a2f9 --repeats 3 --rows 'ppo,ppo vocab-chunk-off,ppo checkpointing' --skip-trl",
    "cdda92e25d56 --repeats 3 --rows ppo",
    "529a2d36f3bd --rows 'dpo,dpo checkpointing,dpo vocab-chunk-off' --skip-trl --max-wait 0.0",
    "d52f1f507371 --repeats 3 --rows grpo --max-wait 60.0",
    "e6f11827a3d1 --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "a5c47b76297d --steps 4 --repeats 3 --rows grpo-lora,ppo-lora",
    "42a192ce0f32 --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "f3740259acbe --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "fb6135d73c66 --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "a81cf2c2955d --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "e880040a76f9 --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "ff289967ee0f --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "53d252443856 --rows sft,rm,dpo",
    "efe11c2b6ce5 --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "efe11c2b6ce5-dirty --rows sft,rm,dpo",
    "c57d8daac73b --steps 4 --repeats 3 --rows ppo,ppo-lora,grpo,grpo-lora",
    "39871de18cf9 --rows sft,rm,dpo",
    "219075cf62e1 --steps 4 --repeats 3 --rows ppo",
    "037bf162e827 --steps 4 --repeats 3 --seed 3 --rows ppo",
    "809d538e981c --steps 4 --repeats 3 --rows grpo,ppo,grpo-lora,ppo-lora",
    "809d538e981c --steps 4 --repeats 3 --seed 3 --rows ppo",
]
REAL_LABELS = {
    "sft": "sft",
    "rm": "rm",
    "dpo": "dpo",
    "grpo": "grpo, full",
    "grpo-lora": "grpo, LoRA r=16",
    "ppo": "ppo, full",
    "ppo-lora": "ppo, LoRA r=16",
}


def real_rows() -> tuple[dict, dict, list[Run]]:
    """Every row of the real-model runs by row name and framework, as a list of repeats: the runs' seeds together,
    a later run's repeat replacing an earlier one of the same seed; the rlhfkit rows as they were before their
    first replacement (name -> (the first replaced run, the seeds that replacing run replaced, that run)); and
    the runs."""
    runs = [Run("real_model", REAL_MACHINE, key) for key in REAL_RUNS]
    by_seed: dict = {}
    replaced: dict = {}
    for run in runs:
        for name, by_framework in run["rows"].items():
            for framework, results in by_framework.items():
                seeds = by_seed.setdefault(name, {}).setdefault(framework, {})
                for r in results:
                    if framework == "rlhfkit" and r["seed"] in seeds:
                        first = replaced.setdefault(name, (seeds[r["seed"]][0], [], run))
                        if first[2] is run:  # only the seeds the first replacing run replaced: later ones are newer
                            first[1].append(seeds[r["seed"]][1])
                    seeds[r["seed"]] = (run, r)
    rows = {
        name: {fw: [r for _, (_, r) in sorted(seeds.items())] for fw, seeds in by_framework.items()}
        for name, by_framework in by_seed.items()
    }
    return rows, replaced, runs


def real_memory() -> list[str]:
    rows, replaced, runs = real_rows()

    def rss(results) -> str:
        return f"{statistics.mean(r['peak_rss_mb'] for r in results):.0f}" if results else "not run"

    out = []
    for name, label in REAL_LABELS.items():
        mine, trl = rows.get(name, {}).get("rlhfkit"), rows.get(name, {}).get("trl")
        if not mine:
            continue
        ratio = statistics.mean(r["peak_rss_mb"] for r in mine) / statistics.mean(r["peak_rss_mb"] for r in trl or mine)
        variants = [rows.get(f"{name} {v}", {}).get("rlhfkit") for v in ("vocab-chunk-off", "checkpointing")]
        cells = [rss(v) for v in variants]
        if name == "rm":
            cells[0] = "no LM head"
        trl_label = f"{rss(trl)} ({trl_name(trl)})" if trl else "not run"
        out.append([label, rss(mine), trl_label, f"**{ratio:.2f}**" if trl else "", *cells])
        if name in replaced:
            run, before, _ = replaced[name]
            ratio = statistics.mean(r["peak_rss_mb"] for r in before) / statistics.mean(
                r["peak_rss_mb"] for r in trl or before
            )
            out.append(
                [f"{label}, at `{run['stamp']['commit'][:7]}`", rss(before), "", f"{ratio:.2f}" if trl else "", "", ""]
            )
    header = [
        "command",
        "rlhfkit peak RSS MB",
        "TRL peak RSS MB",
        "rlhfkit ÷ TRL",
        "rlhfkit, `RLHFKIT_VOCAB_CHUNK=0`",
        "rlhfkit, `--gradient-checkpointing`",
    ]
    notes = []
    off, trl = rows.get("grpo accel-off", {}).get("rlhfkit"), rows.get("grpo", {}).get("trl")
    if off and trl:
        mb = statistics.mean(r["peak_rss_mb"] for r in off)
        ratio = mb / statistics.mean(r["peak_rss_mb"] for r in trl)
        notes.append(
            f"GRPO (full) with `RLHFKIT_ACCEL=0` (no kernel swaps, no lean decode step): {mb:.0f} MB, {ratio:.2f}× TRL's."
        )
    return [*table(header, out), "", *(wrap(n) for n in notes), sources(*runs)]


def real_speed() -> list[str]:
    rows, _, runs = real_rows()
    out = []
    for name in ("grpo", "grpo-lora", "ppo", "ppo-lora"):
        by_framework = rows.get(name, {})
        mine, trl = by_framework.get("rlhfkit"), by_framework.get("trl")
        if not mine:
            continue
        step_a = mean_std([r["step_s"] for r in mine])
        step_b = mean_std([r["step_s"] for r in trl]) if trl else None
        others = [r["others_busy_cores"] for r in (mine + (trl or [])) if r.get("others_busy_cores") is not None]
        out.append(
            [
                REAL_LABELS[name],
                f"{len(mine)} / {len(trl or [])}",
                pm(step_a, 1),
                pm(step_b, 1) if step_b else "not run",
                f"**{step_b[0] / step_a[0]:.2f}×**" if step_b else "",
                f"{statistics.mean(others):.1f} (max {max(others):.1f})" if others else "",
            ]
        )
    header = [
        "algorithm",
        "runs (rlhfkit / TRL)",
        "rlhfkit s/step",
        "TRL s/step",
        "speed-up",
        "cores busy with other work",
    ]
    return [*table(header, out), "", sources(*runs)]


def real_phases() -> list[str]:
    """Where a GRPO / PPO step on the real model goes, median over steps 2..N, mean over runs: rlhfkit's logged phase
    times, and for GRPO TRL's own profiling blocks: ``generate``, ``score``, the reference pass (``rollout_rest``:
    the rest of its input preparation) with its training forward and loss (``loss``), and the rest of the step
    (backward, optimizer, overheads)."""
    rows, _, runs = real_rows()

    def rlhfkit_parts(r: dict) -> list[float]:
        p = r.get("phases") or {k.removeprefix("time/").removesuffix("_s"): v for k, v in r["internal"].items()}
        p = {k.removeprefix("time/").removesuffix("_s"): v for k, v in p.items()}
        parts = [p["generate"], p["score"], p["forward"], p["update"]]
        return [*parts, r["step_s"] - sum(parts)]

    def trl_parts(r: dict) -> list[float]:
        p = r["phases"]
        return [
            p["generate"],
            p["score"],
            p["rollout_rest"] + p["loss"],
            math.nan,
            r["step_s"] - p["prepare"] - p["loss"],
        ]

    labels = [
        "generate",
        "score (reward)",
        "teacher-forced passes: policy with gradients (PPO: and the value model), reference",
        "backward + optimizer (rlhfkit's update phase)",
        "the rest (rlhfkit: overheads; TRL: backward, optimizer, overheads)",
    ]
    columns, header = [], ["seconds per step"]
    for name in ("grpo", "grpo-lora", "ppo", "ppo-lora"):
        mine, trl = rows.get(name, {}).get("rlhfkit"), rows.get(name, {}).get("trl")
        if not mine:
            continue
        columns.append(
            [statistics.mean(x) for x in zip(*map(rlhfkit_parts, mine))] + [mean_std([r["step_s"] for r in mine])[0]]
        )
        header.append(f"rlhfkit {REAL_LABELS[name]}")
        if name.startswith("grpo") and trl:
            columns.append(
                [statistics.mean(x) for x in zip(*map(trl_parts, trl))] + [mean_std([r["step_s"] for r in trl])[0]]
            )
            header.append(f"TRL {REAL_LABELS[name]}")
    out = [
        [label, *(f"{c[i]:.1f}" if c[i] == c[i] else "" for c in columns)] for i, label in enumerate([*labels, "step"])
    ]
    return [*table(header, out), "", sources(*runs)]


# ---- where a PPO step goes ------------------------------------------------------------------------------
PARTS = [  # (row, buckets of profile_ppo.py summed into it)
    ("generate (KV-cache loop)", ["generate"]),
    ("score (decode + RM forward)", ["score"]),
    ("rollout forwards (policy + value; epoch 1's forward)", ["rollout forwards"]),
    ("reference forward", ["reference forward"]),
    ("advantages, misc", ["advantages, misc"]),
    ("PPO epochs: train forward (epochs 2–4)", ["train forward"]),
    ("PPO epochs: backward", ["backward"]),
    ("PPO epochs: optimizer", ["optimizer"]),
    ("loss math + Python overhead", ["loss math", "update overhead", "step overhead", "loop overhead"]),
]
UPDATE = ["train forward", "loss math", "backward", "optimizer", "update overhead"]


def profile_runs() -> list[Run]:
    return [
        Run("profile_ppo", AVX512, "2e37363370a5"),
        Run("profile_ppo", AVX512, "570df7a3f149 --size small"),
    ]


def profile_parts(runs: list[Run] | None = None) -> list[str]:
    runs = runs or profile_runs()
    rows = []
    for label, buckets in PARTS:
        cells = [label]
        for run in runs:
            s = sum(run["median_s"][b] for b in buckets)
            cells += [f"{s:.3f}", f"{s / run['step_s']:.0%}"]
        rows.append(cells)
    rows.append(["step", *(c for run in runs for c in (f"{run['step_s']:.3f}", ""))])
    header = ["part"] + [c for run in runs for c in (f"{run['size']} s", "share")]
    return [*table(header, rows), "", sources(*runs)]


def profile_floor(runs: list[Run] | None = None) -> list[str]:
    runs = runs or profile_runs()
    phases = [  # (row, the phase's key in "flops" and "floor_s", the buckets its measured time sums)
        ("generate", "generate", ["generate"]),
        ("score", "score", ["score"]),
        ("rollout forwards", "rollout forwards", ["rollout forwards"]),
        ("reference forward", "reference forward", ["reference forward"]),
        ("update (the PPO epochs)", "update", UPDATE),
    ]

    def gflop(run: Run, flops: float) -> str:
        return f"{flops / 1e9:.{2 if sum(run['flops'].values()) < 1e10 else 1}f}"

    rows = []
    for label, phase, buckets in phases:
        cells = [label]
        for run in runs:
            measured, floor = sum(run["median_s"][b] for b in buckets), run["floor_s"][phase]
            cells += [gflop(run, run["flops"][phase]), f"{floor:.3f}", f"{measured / floor:.1f}×"]
        rows.append(cells)
    cells = ["step"]
    for run in runs:
        floor = sum(run["floor_s"].values())
        cells += [gflop(run, sum(run["flops"].values())), f"{floor:.3f}", f"{run['step_s'] / floor:.1f}×"]
    rows.append(cells)
    header = ["phase"] + [c for run in runs for c in (f"{run['size']} GFLOP", "floor s", "measured ÷ floor")]
    return [*table(header, rows), "", sources(*runs)]


GPU_MACHINE = "Intel(R) Xeon(R) Processor; torch kernels AVX512, avx2 avx512f avx512_bf16 amx_bf16; 16 cores"
GPU_RUN = "3896111887cd-dirty"
GPU_CPU_RUNS = [(REAL_MACHINE, "c25c919d04de --threads 2")]


def real_gpu() -> list[str]:
    """bench/real_model_gpu.py: the GPU's rows, then the same fp32 rows on the 2-core CPU, and the GPU's agreement
    with the CPU."""
    runs = [Run("real_model_gpu", GPU_MACHINE, GPU_RUN)] + [Run("real_model_gpu", m, k) for m, k in GPU_CPU_RUNS]

    def mean(r: dict, key: str, digits: int = 2) -> str:
        xs = [x for x in r["curves"].get(key, []) if x is not None]
        return f"{statistics.mean(xs):.{digits}f}" if xs else ""

    out = []
    for run in runs:
        device = run["device"].replace("NVIDIA ", "")
        for name, r in run["rows"].items():
            if "error" in r:
                out.append([name, device, "failed", *[""] * 6])
                continue
            phases = r.get("phases") or r.get("internal") or {}
            gpu = f"{r['peak_gpu_mb']:,.0f} / {r['peak_gpu_reserved_mb']:,.0f}" if r.get("peak_gpu_mb") else ""
            out.append(
                [
                    name,
                    device,
                    f"{r['step_s']:.2f}",
                    " / ".join(f"{phases.get(f'time/{k}_s', math.nan):.2f}" for k in ("generate", "forward", "update")),
                    gpu,
                    mean(r, "reward/score"),
                    f"{r['curves']['kl/ref'][-1]:.3f}",
                    mean(r, "policy/entropy"),
                    mean(r, "response/length", 1),
                ]
            )
    header = [
        "row",
        "device",
        "s/step",
        "generate / forward / update s",
        "peak GPU MB (allocated / reserved)",
        "reward/score, mean of steps",
        "kl/ref, last step",
        "policy/entropy, mean",
        "response/length, mean",
    ]
    notes = []
    for agreement in (run["agreement"] for run in runs):
        for name, x in agreement.items():
            if not isinstance(x, dict):
                continue
            notes.append(
                f"{name.replace('cuda', 'GPU').replace('cpu', 'CPU')} against the CPU in fp32, {agreement['prompts']} "
                f"prompts: greedy "
                f"responses identical {x['greedy_same_share']:.0%} (tokens before the first difference "
                f"{x['greedy_tokens_before_first_difference']:.0%}); log-probs of the CPU's responses max |diff| "
                f"{x['logprob_max_abs_diff']:.1e}, mean {x['logprob_mean_abs_diff']:.1e}."
            )
    return [*table(header, out), "", *(wrap(n) for n in notes), sources(*runs)]


TABLES: dict[str, Callable[[], list[str]]] = {
    "speed": speed,
    "speed_readme": lambda: speed(compact=True),
    "ppo_vs_trl_avx2": lambda: ppo_table("ppo_vs_trl", AVX2, "ded3a7111ca7"),
    "ppo_vs_trl_avx512": lambda: ppo_table("ppo_vs_trl", AVX512, "23affda37e5a"),
    "ppo_vs_trl_bf16": lambda: ppo_table("ppo_vs_trl", AVX512, "233716b9c8b7 --sizes small --bf16", bf16=True),
    "ppo_baseline": ppo_baseline,
    "ppo_learning_tiny": ppo_learning_tiny,
    "ppo_learning_small": ppo_learning_small,
    "grpo_vs_trl": grpo_table,
    "loss_aggregation": loss_aggregation_table,
    "real_memory": real_memory,
    "real_speed": real_speed,
    "real_phases": real_phases,
    "real_gpu": real_gpu,
    "real_profile_floor": lambda: profile_floor(
        [Run("profile_ppo", REAL_MACHINE, "39871de18cf9 --size smollm2 --steps 5 --threads 2")]
    ),
    "profile_parts": profile_parts,
    "profile_floor": profile_floor,
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
        print(f"\ntables: {', '.join(stale)} differ from bench/reported; run: python bench/tables.py", file=sys.stderr)
        return 1
    if stale and not args.check:
        print(f"tables: rewrote {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
