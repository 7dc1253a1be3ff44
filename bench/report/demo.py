"""The tables of `rlhfkit demo` over seeds (bench/learning/demo_seeds.py, bench/reported/demo.json): the gold each
policy gained over SFT seed by seed with the tests across seeds, each stage's time, iterated PPO's reward model
round by round, and the same seeds run two ways. Standard library only."""

from __future__ import annotations

import math
import statistics

from bench.report.parts import Run, p_text, select, sources, table
from bench.stats import mean_se, pm, t_test_p, wins

GAINS = {"ppo": "PPO", "iterated": "iterated PPO", "dpo": "DPO", "online_dpo": "online DPO"}
PAIRS = (("ppo", "dpo"), ("iterated", "online_dpo"))  # each pair learns from as many labels


def gain(got: dict, name: str, than: str = "sft") -> tuple[float, float]:
    """Policy ``name``'s mean gold minus ``than``'s, with the paired standard error the run measured (reply by
    reply on the same prompts), else the two means' errors in quadrature."""
    diff = got[f"gold/{name}"] - got[f"gold/{than}"]
    se = (got.get("gold_diff_se") or {}).get(f"{name}-{than}")
    if se is None:
        se = (got.get("gold_diff_se") or {}).get(f"{than}-{name}")
    if se is None:
        se = math.hypot(got[f"gold_se/{name}"], got[f"gold_se/{than}"])
    return diff, se


def gain_cells(got: dict, pairs, columns: dict[str, list[float]]) -> list[str]:
    """For each (policy, than) of ``pairs``: the cell "difference ± paired s.e." of ``gain``, the difference
    appended to ``columns`` under the policy's name (against SFT) or "policy-than"."""
    cells = []
    for name, than in pairs:
        d, se = gain(got, name, than)
        columns[name if than == "sft" else f"{name}-{than}"].append(d)
        cells.append(f"{d:+.2f} ± {se:.2f}")
    return cells


def seeds_of(runs: list[Run]) -> list[tuple[str, dict]]:
    """Every seed of ``runs`` in seed order; a seed in two runs stops the tables."""
    seeds = [kv for run in runs for kv in run["seeds"].items()]
    numbers = [int(k) for k, _ in seeds]
    if len(set(numbers)) != len(numbers):
        raise SystemExit(f"tables: a seed repeats in the demo runs {[run.key for run in runs]}")
    return sorted(seeds, key=lambda kv: int(kv[0]))


def across_seeds(diffs: list[float]) -> str:
    """Per-seed differences as the tables give them: the paired t-test's p and the seeds ahead."""
    return f"{p_text(t_test_p(diffs))}, {wins(diffs)} of {len(diffs)} seeds"


def demo_gains(selection: str, kl: bool = False) -> list[str]:
    """Per seed: SFT's gold, each policy's gain over SFT (± its paired standard error), PPO against DPO and
    iterated PPO against online DPO (each pair at equal labels), the reward model's held-out accuracy (ceiling),
    with ``kl`` each policy's KL to SFT, minutes. Last rows: the mean over seeds ± its standard error, and per
    comparison the paired t-test's p across seeds and how many seeds it won."""
    runs = select(selection)
    rows = []
    columns: dict[str, list[float]] = {k: [] for k in ("sft", *GAINS, *map("-".join, PAIRS), "minutes")}
    for seed, got in seeds_of(runs):
        cells = [seed, f"{got['gold/sft']:.2f}"]
        columns["sft"].append(got["gold/sft"])
        cells += gain_cells(got, [(name, "sft") for name in GAINS], columns)
        cells += gain_cells(got, PAIRS, columns)
        columns["minutes"].append(got["seconds"] / 60)
        cells.append(f"{got['rm/eval_accuracy']:.3f} ({got['rm/label_noise_ceiling']:.3f})")
        if kl:
            cells.append(" / ".join(f"{got[f'kl/{n}']:.1f}" for n in GAINS))
        cells.append(f"{got['seconds'] / 60:.1f}")
        rows.append(cells)
    blank = [""] * kl
    if len(rows) > 1:
        gains = (pm(mean_se(columns[k]), sign="+") for k in (*GAINS, *map("-".join, PAIRS)))
        minutes = f"{statistics.mean(columns['minutes']):.1f}"
        rows.append(["mean ± s.e.", pm(mean_se(columns["sft"])), *gains, "", *blank, minutes])
        tests = [across_seeds(columns[key]) for key in map("-".join, PAIRS)]
        rows.append(["paired t-test across seeds", "", "", "", "", "", *tests, "", *blank, ""])
    header = ["seed", "gold: SFT", *(f"gain: {label}" for label in GAINS.values()), "PPO − DPO"]
    header += ["iterated PPO − online DPO", "RM accuracy (ceiling)"]
    header += ["KL to SFT: " + " / ".join(GAINS.values())] * kl + ["minutes"]
    return [*table(header, rows), "", sources(*runs)]


def demo_stage_times(selection: str) -> list[str]:
    """Stage times per seed (seconds; a stage run beside the others in a child process is marked), the whole
    demo's minutes and the load average (the runs of the gains table beside it, which names them)."""
    seeds = seeds_of(select(selection))
    stages = list(dict.fromkeys(name for _, got in seeds for name in got["stage_seconds"]))
    beside = {name for _, got in seeds for name in got.get("stage_beside") or {}}
    rows = [
        [f"{name} (beside the others)" if name in beside else name]
        + [f"{got['stage_seconds'][name]:.0f}" if name in got["stage_seconds"] else "—" for _, got in seeds]
        for name in stages
    ]
    rows.append(["whole demo (minutes)"] + [f"{got['seconds'] / 60:.1f}" for _, got in seeds])
    rows.append(
        ["load average during the run"]
        + [f"{statistics.mean(got['stage_load_average'].values()):.1f}" for _, got in seeds]
    )
    return table(["stage", *(f"seed {seed}: seconds" for seed, _ in seeds)], rows)


def demo_rounds(selection: str) -> list[str]:
    """Iterated PPO per seed and round: the new on-policy labels, the reward model's accuracy on them before it
    trained on them and after (on the share held out of its training), and the round's last PPO step's reward,
    KL and held-out gold (the runs of the gains table beside it, which names them)."""
    rows = []
    for seed, got in seeds_of(select(selection)):
        for r in got.get("iterated/rounds") or []:
            after = r.get("rm_accuracy_heldout_after")
            rows.append(
                [
                    seed,
                    r["round"],
                    r["labels"],
                    f"{r['rm_accuracy_new_pairs']:.3f}",
                    "—" if after is None else f"{after:.3f}",
                    f"{r['reward']:.2f}",
                    f"{r['kl']:.2f}",
                    "" if r.get("gold") is None else f"{r['gold']:.2f}",
                ]
            )
    header = ["seed", "round", "new labels", "RM accuracy before", "after, held out", "reward", "KL to SFT", "gold"]
    return table(header, rows)


def demo_two_ways(selections: tuple[str, str], labels: tuple[str, str]) -> list[str]:
    """The same seeds run two ways (the two ``selections``, seeds matched by number; ``labels`` name the ways):
    per seed each stage's seconds both ways and the difference, the whole demo's minutes, and each policy's gold
    gain over SFT both ways."""
    first, again = (dict(seeds_of(select(name))) for name in selections)
    header, rows = ["stage"], {}
    for seed in sorted(set(first) & set(again), key=int):
        a, b = first[seed], again[seed]
        header += [f"seed {seed}: {labels[0]}", labels[1], "difference"]
        for name in a["stage_seconds"]:
            x, y = a["stage_seconds"][name], b["stage_seconds"][name]
            rows.setdefault(name, []).extend([f"{x:.0f}", f"{y:.0f}", f"{y - x:+.0f}"])
        x, y = a["seconds"] / 60, b["seconds"] / 60
        rows.setdefault("whole demo (minutes)", []).extend([f"{x:.1f}", f"{y:.1f}", f"{y - x:+.1f}"])
        for name, label in GAINS.items():
            x, y = gain(a, name)[0], gain(b, name)[0]
            rows.setdefault(f"gold gain: {label}", []).extend([f"{x:+.3f}", f"{y:+.3f}", f"{y - x:+.3f}"])
    runs = [run for name in selections for run in select(name)]
    return [*table(header, [[name, *cells] for name, cells in rows.items()]), "", sources(*runs)]
