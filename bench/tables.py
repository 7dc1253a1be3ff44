"""The result tables of docs/performance.md, README.md and docs/concepts.md, rendered from bench/reported/*.json.

    python bench/tables.py           # rewrite the tables in the docs
    python bench/tables.py --check   # exit 1, with a diff, where a doc's table differs from what the files give

A doc marks each table it shows with a comment before it and one after it; what lies between is replaced:

    <!-- table:speed -->
    | benchmark | model | ... |
    <!-- end -->

Each name in TABLES picks its runs by file, machine key and run key (bench/results_file.py), so a table changes
only when its runs change or when it is pointed at other runs. Below each table a line names its files and runs.
Standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from demo_tables import (
    SMOLLM2_LORA_RUNS,
    SMOLLM2_PLAN_RUNS,
    SMOLLM2_THREADS_RUNS,
    TINY_BETA_01_RUNS,
    adapter_load,
    demo_rerun,
    demo_rounds,
    demo_seeds,
    demo_stage_times,
    demo_tiny,
    demo_tiny_again,
    dpo_beta,
    dpo_beta_gold,
    ppo_critic,
    rm_lora,
)
from engine_tables import vllm_engine, vllm_learning, vllm_learning_number
from iterate_tables import CARRY_RUNS, iterate_tasks
from judge_tables import judge
from table_parts import (
    AVX2,
    AVX512,
    AVX512_RECORDED,
    ROOT,
    XEON_AMX,
    Run,
    cpu_label,
    diff_se,
    load,
    mean_se,
    mean_std,
    pm,
    sources,
    table,
    wrap,
)

DOCS = [
    ROOT / "docs" / "performance.md",
    ROOT / "README.md",
    ROOT / "docs" / "concepts.md",
    ROOT / "docs" / "demo.md",
    ROOT / "docs" / "demo-models.md",
    ROOT / "docs" / "generation.md",
    ROOT / "docs" / "iterated.md",
    ROOT / "docs" / "judge.md",
    ROOT / "docs" / "real-models.md",
]
MARKER = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- end -->)", re.S)


def trl_name(runs: list[dict]) -> str:
    return "TRL " + ".".join(str(runs[0].get("version", "")).split(".")[:2])


# ---- learning at equal steps -------------------------------------------------------------------------
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


def learning() -> list[str]:
    """What each framework's policy gained on held-out prompts at an equal number of steps, seed by seed: PPO's
    gold gain over the SFT policy (every seed both frameworks ran), GRPO's held-out reward gain (the reward is the
    gold judge)."""
    ppo_tiny = [
        Run("ppo_vs_trl", AVX512, "23affda37e5a"),
        Run("ppo_vs_trl", AVX512, "10600cc43dc1 --sizes tiny --repeats 36 --lora-r 0 --seed 3 --skip-trl"),
        Run("ppo_vs_trl", AVX512, "10600cc43dc1 --sizes tiny --repeats 40 --lora-r 0 --seed 39"),
    ]
    trl_tiny = [
        Run("ppo_vs_trl", AVX512, "9097a2248ee9 --sizes tiny --repeats 6 --lora-r 0 --seed 3"),
        Run("ppo_vs_trl", AVX512, "e2c85cd23086 --sizes tiny --repeats 10 --lora-r 0 --seed 9"),
        Run("ppo_vs_trl", AVX512, "5a07df0bb9ef --sizes tiny --repeats 20 --lora-r 0 --seed 19"),
    ]
    ppo_small = [
        Run("ppo_vs_trl", AVX512, "23affda37e5a"),
        Run("ppo_vs_trl", AVX512, "a3da41932fc7 --sizes small --repeats 10 --lora-r 0 --seed 3"),
    ]
    grpo = Run("grpo_vs_trl", AVX2, "30d9947d964f --seeds 10")
    rows = []

    def add(benchmark: str, size: str, trl: list[dict], mine: list[tuple[int, dict]], theirs, gain) -> None:
        if [s for s, _ in mine] != [s for s, _ in theirs]:
            raise SystemExit(f"tables: rlhfkit and TRL cover different seeds ({benchmark}, {size})")
        a, b = [gain(r) for _, r in mine], [gain(r) for _, r in theirs]
        rows.append(
            [
                f"{benchmark} against {trl_name(trl)}",
                size,
                seed_range(mine).removeprefix("seeds "),
                pm(mean_se(a), sign="+"),
                pm(mean_se(b), sign="+"),
                pm(diff_se(a, b), sign="+"),
                ahead(a, b),
            ]
        )

    for size, parts_mine, parts_trl in (
        ("tiny", ppo_tiny, [ppo_tiny[0], *trl_tiny, ppo_tiny[2]]),
        ("small", ppo_small, ppo_small),
    ):
        mine, before = learning_parts([(r, "rlhfkit") for r in parts_mine], size)
        theirs, _ = learning_parts([(r, "trl") for r in parts_trl], size)
        add("PPO", size, [r for _, r in theirs], mine, theirs, lambda r, b=before: r["eval"]["gold"] - b["gold"])
    for size in grpo["sizes"]:
        mine, theirs = grpo.seeds(size, "rlhfkit"), grpo.seeds(size, "trl")
        add("GRPO", size, [r for _, r in theirs], mine, theirs, lambda r: r["heldout_gain"])
    header = ["benchmark", "model", "seeds", "rlhfkit", "TRL", "rlhfkit − TRL", "seeds where rlhfkit is ahead"]
    return [*table(header, rows), "", sources(*ppo_tiny, *trl_tiny, *ppo_small, grpo)]


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


def real_speed_rows(real: dict, runs: list[Run], machine: str) -> list[list]:
    """The speed table's SmolLM2 rows of one machine's real-model runs."""
    out = []
    for name, benchmark in (("ppo", "PPO"), ("ppo-lora", "PPO"), ("grpo", "GRPO"), ("grpo-lora", "GRPO")):
        if name not in real:
            continue
        mine, trl = real[name]["rlhfkit"], real[name]["trl"]
        step_a, step_b = (mean_std([r["step_s"] for r in x])[0] for x in (mine, trl))
        rss_a, rss_b = (mean_std([r["peak_rss_mb"] for r in x])[0] for x in (mine, trl))
        params = runs[0]["models"]["params"] / 1e6
        lora = ", LoRA r=16" if name.endswith("lora") else ""
        out.append(
            [
                f"{benchmark} against {trl_name(trl)}",
                f"SmolLM2-135M ({params:.1f}M){lora}",
                cpu_label(machine),
                len(mine),
                f"{step_a:.1f}",
                f"{step_b:.1f}",
                f"**{step_b / step_a:.2f}×**",
                f"{rss_a / rss_b:.2f}",
            ]
        )
    return out


def speed(compact: bool = False) -> list[str]:
    """TRL's mean seconds per step over rlhfkit's, per benchmark, model size and machine. ``compact``: the README's
    version, the real model's rows only, without the step times and the runs' names."""
    ppo_avx2 = Run("ppo_vs_trl", AVX2, "ded3a7111ca7")
    ppo_avx512 = Run("ppo_vs_trl", AVX512, "23affda37e5a")
    grpo = Run("grpo_vs_trl", AVX2, "30d9947d964f --seeds 10")
    runs = (ppo_avx512, ppo_avx2, grpo)
    if any(run["args"].get("bf16") for run in runs):
        raise SystemExit("tables: the speed table compares fp32 runs")
    rows = speed_rows(ppo_avx512, "PPO", 2) + speed_rows(ppo_avx2, "PPO", 2) + speed_rows(grpo, "GRPO", 3)
    real, real_runs = real_rows()
    rows += real_speed_rows(real, real_runs, REAL_MACHINE)
    avx2_runs = [Run("real_model", AVX2, key) for key in REAL_AVX2_RUNS]
    if not compact:
        rows += real_speed_rows(real_rows(avx2_runs)[0], avx2_runs, AVX2)
    runs = (*runs, *real_runs, *avx2_runs)
    header = ["benchmark", "model", "CPU", "seeds", "rlhfkit s/step", "TRL s/step", "speed-up", "peak RSS ÷ TRL's"]
    threads = sorted({run["machine"]["threads"] for run in runs})
    compiled = grpo["args"].get("compile_decode")
    note = (
        f"fp32, {'/'.join(map(str, threads))} threads; speed-up: TRL's seconds per step ÷ rlhfkit's (each run's "
        "median step time, mean over its seeds)"
        + "; SmolLM2: 16 completions of 32 tokens per step, PPO with one epoch"
        + " (see [below](#a-real-model-smollm2-135m-instruct))"
        + (f"; GRPO's rlhfkit runs at {compiled} sample with `--compile-decode`." if compiled else ".")
    )
    if compact:
        keep = [0, 1, 6, 7]
        real_only = [[r[i] for i in keep] for r in rows if r[1].startswith("SmolLM2")]
        note = (
            f"fp32 on 2 cores of an {cpu_label(REAL_MACHINE).split(',')[0]} with AVX-512; speed-up: TRL's seconds "
            "per step ÷ rlhfkit's; 16 completions of 32 tokens per step, PPO with one epoch."
        )
        return [*table([header[i] for i in keep], real_only), "", wrap(note)]
    return [*table(header, rows), "", wrap(note), sources(*runs)]


# ---- the real model (bench/real_model.py) ------------------------------------------------------------------
REAL_MACHINE = AVX512_RECORDED
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
REAL_AVX2_RUNS = ["d8a8ea218357 --rows grpo,ppo,grpo-lora,ppo-lora --max-wait 20.0"]  # oneDNN chosen per use
REAL_LABELS = {
    "sft": "sft",
    "rm": "rm",
    "dpo": "dpo",
    "grpo": "grpo, full",
    "grpo-lora": "grpo, LoRA r=16",
    "ppo": "ppo, full",
    "ppo-lora": "ppo, LoRA r=16",
}


def real_rows(runs: list[Run] | None = None) -> tuple[dict, list[Run]]:
    """Every row of the real-model runs (default: REAL_RUNS) by row name and framework, as a list of repeats: the
    runs' seeds together, a later run's repeat replacing an earlier one of the same seed; and the runs."""
    runs = runs if runs is not None else [Run("real_model", REAL_MACHINE, key) for key in REAL_RUNS]
    by_seed: dict = {}
    for run in runs:
        for name, by_framework in run["rows"].items():
            for framework, results in by_framework.items():
                seeds = by_seed.setdefault(name, {}).setdefault(framework, {})
                for r in results:
                    seeds[r["seed"]] = r
    rows = {
        name: {fw: [r for _, r in sorted(seeds.items())] for fw, seeds in by_framework.items()}
        for name, by_framework in by_seed.items()
    }
    return rows, runs


def real_memory() -> list[str]:
    """Peak resident memory of every command on the real model, against TRL's, and with gradient checkpointing."""
    rows, runs = real_rows()

    def mb(results) -> float:
        return statistics.mean(r["peak_rss_mb"] for r in results)

    out = []
    for name, label in REAL_LABELS.items():
        mine, trl = rows.get(name, {}).get("rlhfkit"), rows.get(name, {}).get("trl")
        if not mine:
            continue
        checkpointed = rows.get(f"{name} checkpointing", {}).get("rlhfkit")
        out.append(
            [
                label,
                f"{mb(mine):,.0f}",
                f"{mb(trl):,.0f} ({trl_name(trl)})" if trl else "not run",
                f"**{mb(mine) / mb(trl):.2f}**" if trl else "",
                f"{mb(checkpointed):,.0f}" if checkpointed else "not run",
            ]
        )
    header = [
        "command",
        "rlhfkit peak RSS MB",
        "TRL peak RSS MB",
        "rlhfkit ÷ TRL",
        "rlhfkit, `--gradient-checkpointing`",
    ]
    return [*table(header, out), "", sources(*runs)]


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
                out.append([name, device, "failed", *[""] * 4])
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


PIECES_MACHINE = AVX2
# What each piece of the performance code buys on SmolLM2 (bench/accel_ab.py): the pieces the code keeps, each
# with the rows where it applies, and what the runs without it measured.
PIECES = {
    "packing": "sequence packing",
    "lean_decode": "lean decode step",
    "vocab_blocks": "block-wise vocabulary log-probs",
    "value_pass_apart": "value model's pass apart",
    "swiglu_mlp": "SwiGLU MLP keeping two activations less",
    "onednn_linears": "oneDNN fp32 linears",
    "fused_lora": "LoRA sum in place",
    "kept_heap": "kept heap",
}
AB_ROWS = {"grpo": "GRPO full", "grpo-lora": "GRPO LoRA", "ppo": "PPO full", "ppo-lora": "PPO LoRA"}


def ab_runs() -> tuple[dict, list[Run]]:
    """Every run of bench/reported/accel_ab.json on PIECES_MACHINE by row and variant, over all its run keys."""
    runs = [Run("accel_ab", PIECES_MACHINE, key) for key in load("accel_ab")["machines"][PIECES_MACHINE]]
    merged: dict = {}
    for run in runs:
        for name, by_variant in run["rows"].items():
            for variant, results in by_variant.items():
                merged.setdefault(name, {}).setdefault(variant, []).extend(results)
    return merged, runs


def pieces() -> list[str]:
    """Per kept piece and row: how much slower (seconds per step) and larger (peak RSS) the runs with that piece
    left off were than the baseline runs with everything on (their means), where the piece applies."""
    merged, runs = ab_runs()
    out = []
    for piece, label in PIECES.items():
        cells = []
        for name in AB_ROWS:
            by_variant = merged.get(name, {})
            off, base = by_variant.get(piece), by_variant.get("base")
            if not off or not base:
                cells.append("—")
                continue
            step = statistics.mean(r["step_s"] for r in off) / statistics.mean(r["step_s"] for r in base) - 1
            rss = statistics.mean(r["peak_rss_mb"] for r in off) / statistics.mean(r["peak_rss_mb"] for r in base) - 1
            cells.append(f"{step:+.0%} / {rss:+.0%}")
        out.append([label, *cells])
    base = {name: by_variant.get("base", []) for name, by_variant in merged.items()}
    out.append(
        [
            "*everything on: s/step, peak RSS MB*",
            *(
                f"{statistics.mean(r['step_s'] for r in base[n]):.1f} s, "
                f"{statistics.mean(r['peak_rss_mb'] for r in base[n]):,.0f}"
                if base.get(n)
                else "—"
                for n in AB_ROWS
            ),
        ]
    )
    header = ["left off", *(f"{label}: time / memory" for label in AB_ROWS.values())]
    return [*table(header, out), "", sources(*runs)]


TABLES: dict[str, Callable[[], list[str]]] = {
    "pieces": pieces,
    "speed": speed,
    "speed_readme": lambda: speed(compact=True),
    "learning": learning,
    "loss_aggregation": loss_aggregation_table,
    "real_memory": real_memory,
    "real_gpu": real_gpu,
    "demo_seeds": demo_seeds,
    "demo_tiny": demo_tiny,
    "demo_tiny_beta_0_1": lambda: demo_tiny(TINY_BETA_01_RUNS),
    "demo_stage_times": demo_stage_times,
    "demo_tiny_again": demo_tiny_again,
    "demo_smol": lambda: demo_tiny(SMOLLM2_PLAN_RUNS, kl=True),
    "demo_smol_stage_times": lambda: demo_stage_times(SMOLLM2_PLAN_RUNS),
    "demo_smol_rounds": lambda: demo_rounds(SMOLLM2_PLAN_RUNS),
    "demo_smol_rerun": demo_rerun,
    "demo_smol_threads": lambda: demo_rerun(SMOLLM2_THREADS_RUNS, ("--threads 2", "--threads 1")),
    "demo_smol_lora": lambda: demo_tiny(SMOLLM2_LORA_RUNS, kl=True),
    "demo_smol_lora_stage_times": lambda: demo_stage_times(SMOLLM2_LORA_RUNS),
    "demo_smol_lora_rounds": lambda: demo_rounds(SMOLLM2_LORA_RUNS),
    "dpo_beta": dpo_beta,
    "demo_smol_dpo_beta": lambda: dpo_beta(XEON_AMX, "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "dpo_beta_gold": dpo_beta_gold,
    "demo_smol_critic": ppo_critic,
    "rm_lora": rm_lora,
    "adapter_load": adapter_load,
    "vllm_engine": vllm_engine,
    "vllm_learning": vllm_learning,
    "vllm_learning_number": vllm_learning_number,
    "iterate_tasks": iterate_tasks,
    "iterate_carry": lambda: iterate_tasks(CARRY_RUNS),
    "judge": judge,
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
