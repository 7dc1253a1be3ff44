"""The table of bench/iterate_tasks.py (bench/reported/iterate_tasks.json): per built-in task, each method's gold
gain over SFT at equal labels, seed by seed with its paired standard error, and over seeds; then iterated minus
plain PPO with a paired t-test across seeds. Standard library only."""

from __future__ import annotations

import math
import statistics

from table_parts import XEON_AMX, Run, sources

EPYC_AVX512 = "AMD EPYC; torch kernels AVX512, avx2 avx512f avx512_bf16; 2 cores"
# The runs the docs table shows (machine key, run key); their task-seeds are shown together.
ITERATE_RUNS: list[tuple[str, str]] = [(EPYC_AVX512, "53412b27678f")]
# iterated PPO and online DPO with and without --carry-optimizer, on the tasks where iterated PPO moved
CARRY_METHODS = "--methods iterated,iterated_carried,online_dpo,online_dpo_carried"
CARRY_RUNS: list[tuple[str, str]] = [
    (XEON_AMX, f"ebc9e988dc6c --tasks support,notes --seeds 0,1 {CARRY_METHODS}"),
    (XEON_AMX, f"17fbc9ecf338 --tasks support,notes --seeds 2,3 {CARRY_METHODS}"),
]
METHODS = {
    "ppo": "plain PPO",
    "iterated": "iterated PPO",
    "iterated_fixed_rm_lr": "iterated PPO, RM updates at 2e-5",
    "iterated_rm_trust_off": "iterated PPO, --rm-trust 0",
    "iterated_carried": "iterated PPO, optimizer carried",
    "dpo": "DPO",
    "online_dpo": "online DPO",
    "online_dpo_carried": "online DPO, optimizer carried",
}
# paired differences a run records (bench/iterate_tasks.py PAIRED), as the table names them
DIFFERENCES = {
    "iterated_minus_ppo": "iterated − plain PPO",
    "iterated_carried_minus_restarted": "iterated PPO: carried − restarted",
    "online_dpo_carried_minus_restarted": "online DPO: carried − restarted",
}
TASK_ORDER = ("support", "arithmetic", "notes")


def t_test_p(values: list[float]) -> float | None:
    """Two-sided p of a one-sample t-test of mean 0 (Student's t, n - 1 degrees of freedom, its density integrated
    by Simpson's rule); None for fewer than 2 values or none that differ."""
    n = len(values)
    if n < 2 or statistics.stdev(values) == 0:
        return None
    t = abs(statistics.mean(values)) / (statistics.stdev(values) / math.sqrt(n))
    df = n - 1
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    steps = 20000
    h = t / steps
    density = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
    inner = h / 3 * (density[0] + density[-1] + 4 * sum(density[1:-1:2]) + 2 * sum(density[2:-1:2]))
    return max(0.0, 1 - 2 * inner)


def over_seeds(values: list[float]) -> str:
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{mean:+.2f}"
    return f"{mean:+.2f} ± {statistics.stdev(values) / math.sqrt(len(values)):.2f}"


def rows_of(results: dict) -> list[str]:
    """The table's lines for one run's ``results`` ({"TASK-SEED": result})."""
    seeds = sorted({int(k.rsplit("-", 1)[1]) for k in results})
    tasks = [t for t in TASK_ORDER if any(k.startswith(f"{t}-") for k in results)]
    tasks += sorted({k.rsplit("-", 1)[0] for k in results} - set(tasks))
    lines = [
        "| task | policy | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± s.e. over seeds |",
        "|---|---|" + "---|" * (len(seeds) + 1),
    ]
    for task in tasks:
        per_seed = [results.get(f"{task}-{s}") for s in seeds]
        done = [r for r in per_seed if r]
        cells = [f"{r['sft_gold']:.2f}" if r else "–" for r in per_seed]
        mean_sft = statistics.mean(r["sft_gold"] for r in done)
        lines.append(f"| {task} | SFT (gold) | " + " | ".join(cells) + f" | {mean_sft:.2f} |")
        for m, name in METHODS.items():
            if not all(m in r for r in done):
                continue  # a method some runs did not have
            cells = [f"{r[m]['gain']:+.2f} ± {r[m]['gain_se']:.2f}" if r else "–" for r in per_seed]
            lines.append(f"| | {name} | " + " | ".join(cells) + f" | {over_seeds([r[m]['gain'] for r in done])} |")
        for key, name in DIFFERENCES.items():
            if all(key in r for r in done):
                lines.append(difference_row(key, name, per_seed))
    return lines


def difference_row(key: str, name: str, per_seed: list[dict | None]) -> str:
    """One paired difference seed by seed (± its paired s.e.), and over seeds with a t-test and the sign count."""
    diffs = [r[key]["mean"] for r in per_seed if r]
    p = t_test_p(diffs)
    above = sum(d > 0 for d in diffs)
    cells = [f"{r[key]['mean']:+.2f} ± {r[key]['se']:.2f}" if r else "–" for r in per_seed]
    tail = over_seeds(diffs) + (f", t-test p = {p:.2f}" if p is not None else "") + f", {above}/{len(diffs)} > 0"
    return f"| | {name} | " + " | ".join(cells) + f" | {tail} |"


def iterate_tasks(where: list[tuple[str, str]] | None = None) -> list[str]:
    """The docs table: the task-seeds of the ``where`` runs together (a later run's task-seed replaces an
    earlier one's), then the line naming the runs."""
    runs = [Run("iterate_tasks", *w) for w in (ITERATE_RUNS if where is None else where)]
    results: dict = {}
    for run in runs:
        results.update(run["results"])
    if not results:
        return ["No runs yet."]
    return rows_of(results) + ["", sources(*runs)]


__all__ = ["CARRY_RUNS", "ITERATE_RUNS", "iterate_tasks", "rows_of", "t_test_p"]
