"""docs/generation.md's tables: rlhfkit's own sampler against a colocated vLLM engine, in time
(bench/speed/vllm_engine.py) and in what GRPO learns (bench/learning/vllm_learning.py). Standard library only."""

from __future__ import annotations

from bench.report.parts import p_text, select, sources, table
from bench.stats import mean_se, paired, pm, t_test_p, wins


def vllm_engine(selection: str) -> list[str]:
    """Per command and sampler, the median over a run's steps 2..N of: sampling (the sampling phase less the
    engine's weight load), the weight load, the whole step, and the engine's log-probs' mean gap to the
    trainer's."""
    (run,) = select(selection)
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


LEARNING_ROWS = {
    "own": ("own", "full"),
    "vllm": ("vLLM", "full"),
    "own-lora": ("own", "LoRA"),
    "vllm-lora": ("vLLM", "LoRA"),
}
LEARNING_PAIRS = {"full": ("own", "vllm"), "LoRA": ("own-lora", "vllm-lora")}


def vllm_learning(*selection_names: str) -> list[str]:
    """GRPO's reward with each sampler, over the seeds of the runs: per row the mean over seeds of each step's
    reward and of the last quarter of the steps (± its standard error over seeds); then per kind of fine-tuning
    own minus vLLM over the seeds run with both (mean ± standard error, the paired t-test's p, the seeds where the
    own sampler ended higher)."""
    runs = [run for name in selection_names for run in select(name)]
    results = [r for run in runs for r in run["results"]]
    steps = len(results[0]["reward"])
    tail = max(1, steps // 4)
    ends = {name: {} for name in LEARNING_ROWS}  # row -> seed -> mean of the last steps
    rows = []
    for name, (sampler, tuning) in LEARNING_ROWS.items():
        curves = [r for r in results if r["row"] == name]
        if not curves:
            continue
        for r in curves:
            ends[name][r["seed"]] = sum(r["reward"][-tail:]) / tail
        means = [sum(c["reward"][i] for c in curves) / len(curves) for i in range(steps)]
        rows.append(
            [
                sampler,
                tuning,
                len(curves),
                " ".join(f"{x:.2f}" for x in means),
                f"**{pm(mean_se(ends[name].values()))}**",
            ]
        )
    for tuning, (own, engine) in LEARNING_PAIRS.items():
        seeds = sorted(set(ends[own]) & set(ends[engine]))
        if len(seeds) < 2:
            continue
        a, b = [ends[own][s] for s in seeds], [ends[engine][s] for s in seeds]
        diffs = [x - y for x, y in zip(a, b)]
        summary = (
            f"{pm(paired(a, b), sign='+')} ({p_text(t_test_p(diffs))}; own higher in {wins(diffs)} of {len(seeds)})"
        )
        rows.append(["own − vLLM", tuning, len(seeds), "paired by seed", summary])
    header = ["sampler", "fine-tuning", "seeds", f"mean reward, steps 1-{steps}"]
    header.append(f"mean of steps {steps - tail + 1}-{steps} ± s.e.")
    return [*table(header, rows), "", sources(*runs)]
