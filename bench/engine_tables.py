"""docs/generation.md's table of the own sampler against a colocated vLLM engine (bench/vllm_engine.py,
bench/reported/vllm_engine.json). Standard library only."""

from __future__ import annotations

from demo_tables import p_text
from iterate_tables import t_test_p
from table_parts import AVX2, AVX512_RECORDED, XEON_AMX, Run, mean_se, pm, sources, table

# The run the table shows (machine key, run key).
VLLM_RUN = (AVX2, "78314bf37071 --steps 3")


def vllm_engine(where: tuple[str, str] = VLLM_RUN) -> list[str]:
    """Per command and sampler, the median over a run's steps 2..N of: sampling (the sampling phase less the
    engine's weight load), the weight load, the whole step, and the engine's log-probs' mean gap to the
    trainer's."""
    run = Run("vllm_engine", *where)
    rows = []
    for r in run["results"]:
        sync = r["weight_sync_s"]
        rows.append(
            [
                r["command"],
                r["sampler"],
                f"{r['sample_s'] - (sync or 0.0):.2f}",
                "-" if sync is None else f"{sync:.2f}",
                f"{r['step_s']:.2f}",
                "-" if r["logprob_diff"] is None else f"{r['logprob_diff']:.1e}",
            ]
        )
    header = ["command", "sampler", "sampling s", "weight sync s", "step s", "engine / trainer log-prob gap"]
    return [*table(header, rows), "", sources(run)]


# The learning comparison's runs the table shows (machine key, run key): seeds swept in one or more runs, on one
# or more machines.
LEARNING_RUNS = [
    (AVX512_RECORDED, "d6073a541a14-dirty"),
    (AVX512_RECORDED, "e029de05bf26-dirty --seeds 3,4,5 --rows own,vllm"),
    (AVX512_RECORDED, "ac391f8b35bf --seeds 3,4,5 --rows own-lora,vllm-lora"),
    (XEON_AMX, "b09a4f21b238 --seeds 6,7,8,9,10,11,12,13 --rows own"),
    (XEON_AMX, "b09a4f21b238 --seeds 6,7,8,9,10,11,12,13 --rows vllm"),
]
# The same comparison with --task number (a reward the model earns about half the time at the start).
NUMBER_RUNS = [
    (XEON_AMX, "05850041a842 --task number --steps 10 --rows own,own-lora"),
    (XEON_AMX, "05850041a842 --task number --steps 10 --rows vllm,vllm-lora"),
]
LEARNING_ROWS = {
    "own": ("own", "full"),
    "vllm": ("vLLM", "full"),
    "own-lora": ("own", "LoRA"),
    "vllm-lora": ("vLLM", "LoRA"),
}
CURVES = 6  # a row's seeds up to which each seed's curve is shown (beyond: the mean curve, each seed's end)
LEARNING_PAIRS = {"full": ("own", "vllm"), "LoRA": ("own-lora", "vllm-lora")}


def vllm_learning(where: list[tuple[str, str]] = LEARNING_RUNS) -> list[str]:
    """GRPO's reward per step with each sampler (bench/vllm_learning.py): every seed's curve (up to ``CURVES`` seeds
    a row; beyond, each seed's end only), then per row the
    mean over seeds of each step and of the last quarter of the steps (± its standard error over seeds); last,
    per kind of fine-tuning, own minus vLLM over the seeds run with both (their mean ± standard error, the paired
    t-test's p, the seeds where the own sampler ended higher)."""
    runs = [Run("vllm_learning", *w) for w in where]
    results = [r for run in runs for r in run["results"]]
    steps = len(results[0]["reward"])
    tail = max(1, steps // 4)
    joined = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    ends = {name: {} for name in LEARNING_ROWS}  # row -> seed -> mean of the last steps
    rows = []
    for name, (sampler, tuning) in LEARNING_ROWS.items():
        curves = sorted((r for r in results if r["row"] == name), key=lambda r: r["seed"])
        if not curves:
            continue
        for r in curves:
            ends[name][r["seed"]] = sum(r["reward"][-tail:]) / tail
            curve = joined(r["reward"]) if len(curves) <= CURVES else ""  # many seeds: their means below
            rows.append([sampler, tuning, r["seed"], curve, f"{ends[name][r['seed']]:.2f}"])
        means = [sum(c["reward"][i] for c in curves) / len(curves) for i in range(steps)]
        mean, se = mean_se(list(ends[name].values()))
        spread = f" ± {se:.2f}" if len(curves) > 1 else ""
        rows.append([sampler, tuning, "mean", joined(means), f"**{mean:.2f}**{spread}"])
    for tuning, (own, engine) in LEARNING_PAIRS.items():
        seeds = sorted(set(ends[own]) & set(ends[engine]))
        if len(seeds) < 2:
            continue
        diffs = [ends[own][s] - ends[engine][s] for s in seeds]
        ahead = sum(d > 0 for d in diffs)
        summary = f"{pm(mean_se(diffs), sign='+')} ({p_text(t_test_p(diffs))}; own higher in {ahead} of {len(seeds)})"
        rows.append(["own − vLLM", tuning, f"{len(seeds)} seeds", "paired by seed", summary])
    header = ["sampler", "fine-tuning", "seed", f"reward, steps 1-{steps}", f"mean of steps {steps - tail + 1}-{steps}"]
    return [*table(header, rows), "", sources(*runs)]


def vllm_learning_number(where: list[tuple[str, str]] = NUMBER_RUNS) -> list[str]:
    """``vllm_learning``'s table for bench/vllm_learning.py --task number."""
    return vllm_learning(where)
