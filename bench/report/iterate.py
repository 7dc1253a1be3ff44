"""The table of bench/learning/iterate_tasks.py (bench/reported/iterate_tasks.json): per built-in task, each method's gold
gain over SFT at equal labels, seed by seed with its paired standard error, and over seeds; then iterated minus
plain PPO with a paired t-test across seeds. Standard library only."""

from __future__ import annotations

import statistics

from bench.report.parts import select, sources
from bench.stats import mean_se, t_test_p, wins

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
# paired differences a run records (bench/learning/iterate_tasks.py PAIRED), as the table names them
DIFFERENCES = {
    "iterated_minus_ppo": "iterated − plain PPO",
    "iterated_carried_minus_restarted": "iterated PPO: carried − restarted",
    "online_dpo_carried_minus_restarted": "online DPO: carried − restarted",
}
TASK_ORDER = ("support", "arithmetic", "notes")


def over_seeds(values: list[float]) -> str:
    mean, se = mean_se(values)
    return f"{mean:+.2f}" if len(values) < 2 else f"{mean:+.2f} ± {se:.2f}"


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
    above = wins(diffs)
    cells = [f"{r[key]['mean']:+.2f} ± {r[key]['se']:.2f}" if r else "–" for r in per_seed]
    tail = over_seeds(diffs) + (f", t-test p = {p:.2f}" if p is not None else "") + f", {above}/{len(diffs)} > 0"
    return f"| | {name} | " + " | ".join(cells) + f" | {tail} |"


def iterate_tasks(selection: str) -> list[str]:
    """The docs table: the task-seeds of the selection's runs together (a later run's task-seed replaces an
    earlier one's), then the line naming the runs."""
    runs = select(selection)
    results: dict = {}
    for run in runs:
        results.update(run["results"])
    return rows_of(results) + ["", sources(*runs)]
