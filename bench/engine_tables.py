"""docs/generation.md's table of the own sampler against a colocated vLLM engine (bench/vllm_engine.py,
bench/reported/vllm_engine.json). Standard library only."""

from __future__ import annotations

import statistics

from table_parts import AVX2, Run, sources, table

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


# The learning comparison's runs the table shows (machine key, run keys): seeds swept in one or more runs.
LEARNING_RUNS = (
    "AMD EPYC; torch kernels AVX512, avx2 avx512f avx512_bf16; 2 cores",
    [
        "d6073a541a14-dirty",
        "e029de05bf26-dirty --seeds 3,4,5 --rows own,vllm",
        "ac391f8b35bf --seeds 3,4,5 --rows own-lora,vllm-lora",
    ],
)
LEARNING_ROWS = {
    "own": ("own", "full"),
    "vllm": ("vLLM", "full"),
    "own-lora": ("own", "LoRA"),
    "vllm-lora": ("vLLM", "LoRA"),
}


def vllm_learning(where: tuple[str, list[str]] = LEARNING_RUNS) -> list[str]:
    """GRPO's reward per step with each sampler (bench/vllm_learning.py): every seed's curve, then per row the
    mean over seeds of each step and of the last quarter of the steps (± its standard error over seeds)."""
    machine, keys = where
    runs = [Run("vllm_learning", machine, key) for key in keys]
    results = [r for run in runs for r in run["results"]]
    steps = len(results[0]["reward"])
    tail = max(1, steps // 4)
    joined = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    rows = []
    for name, (sampler, tuning) in LEARNING_ROWS.items():
        curves = sorted((r for r in results if r["row"] == name), key=lambda r: r["seed"])
        if not curves:
            continue
        for r in curves:
            rows.append([sampler, tuning, r["seed"], joined(r["reward"]), f"{sum(r['reward'][-tail:]) / tail:.2f}"])
        means = [sum(c["reward"][i] for c in curves) / len(curves) for i in range(steps)]
        tails = [sum(c["reward"][-tail:]) / tail for c in curves]
        spread = f" ± {statistics.stdev(tails) / len(tails) ** 0.5:.2f}" if len(tails) > 1 else ""
        rows.append([sampler, tuning, "mean", joined(means), f"**{sum(tails) / len(tails):.2f}**{spread}"])
    header = ["sampler", "fine-tuning", "seed", f"reward, steps 1-{steps}", f"mean of steps {steps - tail + 1}-{steps}"]
    return [*table(header, rows), "", sources(*runs)]
