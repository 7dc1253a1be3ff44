"""docs/performance.md's tables and the README's: rlhfkit against TRL (speed, peak memory, learning at equal
steps), on the built-in task's models and on SmolLM2-135M-Instruct, on the CPU and a GPU, and what each piece of
rlhfkit/accel buys. Standard library only."""

from __future__ import annotations

import math
import statistics

from bench.report.parts import Run, cpu_label, select, sources, table, wrap
from bench.stats import diff_se, mean_se, mean_std, pm, wins


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
    return f"{wins(x - y for x, y in zip(a, b))} of {len(a)}"


def learning() -> list[str]:
    """What each framework's policy gained on held-out prompts at an equal number of steps, seed by seed: PPO's
    gold gain over the SFT policy (every seed both frameworks ran), GRPO's held-out reward gain (the reward is the
    gold judge)."""
    ppo_tiny, trl_tiny = select("ppo_vs_trl/learning-tiny"), select("ppo_vs_trl/learning-tiny-trl")
    ppo_small = select("ppo_vs_trl/learning-small")
    (grpo,) = select("grpo_vs_trl")
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

    for size, parts_mine, parts_trl in (("tiny", ppo_tiny, trl_tiny), ("small", ppo_small, ppo_small)):
        mine, before = learning_parts([(r, "rlhfkit") for r in parts_mine], size)
        theirs, _ = learning_parts([(r, "trl") for r in parts_trl], size)
        add("PPO", size, [r for _, r in theirs], mine, theirs, lambda r, b=before: r["eval"]["gold"] - b["gold"])
    for size in grpo["sizes"]:
        mine, theirs = grpo.seeds(size, "rlhfkit"), grpo.seeds(size, "trl")
        add("GRPO", size, [r for _, r in theirs], mine, theirs, lambda r: r["heldout_gain"])
    header = ["benchmark", "model", "seeds", "rlhfkit", "TRL", "rlhfkit − TRL", "seeds where rlhfkit is ahead"]
    return [*table(header, rows), "", sources(*ppo_tiny, *trl_tiny, *ppo_small, grpo)]


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
    (ppo_avx2,), (ppo_avx512,), (grpo,) = select("ppo_vs_trl/avx2"), select("ppo_vs_trl/avx512"), select("grpo_vs_trl")
    runs = (ppo_avx512, ppo_avx2, grpo)
    if any(run["args"].get("bf16") for run in runs):
        raise SystemExit("tables: the speed table compares fp32 runs")
    rows = speed_rows(ppo_avx512, "PPO", 2) + speed_rows(ppo_avx2, "PPO", 2) + speed_rows(grpo, "GRPO", 3)
    real, real_runs = real_rows()
    rows += real_speed_rows(real, real_runs, real_runs[0].machine)
    avx2_runs = select("real_model/avx2")
    if not compact:
        rows += real_speed_rows(real_rows(avx2_runs)[0], avx2_runs, avx2_runs[0].machine)
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
            f"fp32 on 2 cores of an {cpu_label(real_runs[0].machine).split(',')[0]} with AVX-512; speed-up: TRL's seconds "
            "per step ÷ rlhfkit's; 16 completions of 32 tokens per step, PPO with one epoch."
        )
        return [*table([header[i] for i in keep], real_only), "", wrap(note)]
    return [*table(header, rows), "", wrap(note), sources(*runs)]


# ---- the real model (bench/vs_trl/real_model.py) ------------------------------------------------------------
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
    """Every row of the real-model runs (default: the selection ``real_model``) by row name and framework, as a
    list of repeats: the runs' seeds together, a later run's repeat replacing an earlier one of the same seed; and
    the runs."""
    runs = runs if runs is not None else select("real_model")
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


def real_gpu() -> list[str]:
    """bench/speed/real_model_gpu.py: the GPU's rows, then the same fp32 rows on the 2-core CPU, and the GPU's
    agreement with the CPU."""
    runs = select("real_model_gpu") + select("real_model_gpu/cpu")

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
                f"{name.replace('cuda', 'GPU').replace('cpu', 'CPU')} against the CPU in fp32 ({agreement['prompts']} "
                f"prompts): greedy replies the same {x['greedy_same_share']:.0%}, log-probs max |diff| "
                f"{x['logprob_max_abs_diff']:.1e}."
            )
    return [*table(header, out), "", *(wrap(n) for n in notes), sources(*runs)]


# What each piece of the performance code buys on SmolLM2 (bench/speed/accel_ab.py): the pieces the code keeps, each
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
    """The runs of the selection ``accel_ab`` by row and variant."""
    runs = select("accel_ab")
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
