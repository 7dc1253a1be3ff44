"""docs/demo.md's tables of `rlhfkit demo` over seeds (bench/demo_seeds.py, bench/reported/demo.json): the gold
each policy gained over SFT seed by seed, and iterated PPO's reward model round by round. Standard library only."""

from __future__ import annotations

import math
import statistics

from iterate_tables import t_test_p
from table_parts import AVX2, Run, mean_se, pm, sources, table

# The SmolLM2-135M-Instruct runs the tables show (machine key, run key); their seeds are shown together.
SMOLLM2_RUNS = [
    (AVX2, "e2dd9f30c0e1 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0"),
    (AVX2, "9c0c4c8f1b47 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 1,2"),
    (AVX2, "1e78a127c4db --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 2"),
]
GAINS = {"ppo": "PPO", "iterated": "iterated PPO", "dpo": "DPO"}


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


def seeds_of(runs: list[Run]) -> list[tuple[str, dict]]:
    """Every seed of ``runs`` in seed order; a seed in two runs stops the tables."""
    seeds = [kv for run in runs for kv in run["seeds"].items()]
    numbers = [int(k) for k, _ in seeds]
    if len(set(numbers)) != len(numbers):
        raise SystemExit(f"tables: a seed repeats in the demo runs {[run.key for run in runs]}")
    return sorted(seeds, key=lambda kv: int(kv[0]))


def demo_seeds(where: list[tuple[str, str]] = SMOLLM2_RUNS) -> list[str]:
    """Per seed: SFT's gold, each policy's gain over SFT (± its paired standard error), PPO's and iterated PPO's
    lead over DPO, the reward model's held-out accuracy and the label-noise ceiling, KL to SFT, minutes. Last
    row: the mean over seeds ± its standard error."""
    runs = [Run("demo", *w) for w in where]
    rows, columns = [], {k: [] for k in ("sft", *GAINS, "ppo-dpo", "iterated-dpo", "rm", "minutes")}
    for seed, got in seeds_of(runs):
        cells = [seed, f"{got['gold/sft']:.2f}"]
        columns["sft"].append(got["gold/sft"])
        for name in GAINS:
            d, se = gain(got, name)
            columns[name].append(d)
            cells.append(f"{d:+.2f} ± {se:.2f}")
        for name in ("ppo", "iterated"):
            d, se = gain(got, name, "dpo")
            columns[f"{name}-dpo"].append(d)
            cells.append(f"{d:+.2f} ± {se:.2f}")
        columns["rm"].append(got["rm/eval_accuracy"])
        columns["minutes"].append(got["seconds"] / 60)
        cells += [
            f"{got['rm/eval_accuracy']:.3f} ({got['rm/label_noise_ceiling']:.3f})",
            " / ".join(f"{got[f'kl/{n}']:.2f}" for n in GAINS),
            f"{got['seconds'] / 60:.0f}",
        ]
        rows.append(cells)
    if len(rows) > 1:
        rows.append(
            [
                "mean ± s.e.",
                pm(mean_se(columns["sft"])),
                *(pm(mean_se(columns[k]), sign="+") for k in (*GAINS, "ppo-dpo", "iterated-dpo")),
                f"{statistics.mean(columns['rm']):.3f}",
                "",
                f"{statistics.mean(columns['minutes']):.0f}",
            ]
        )
    header = [
        "seed",
        "gold: SFT",
        *(f"gain: {label}" for label in GAINS.values()),
        "PPO − DPO",
        "iterated PPO − DPO",
        "RM accuracy (ceiling)",
        "KL to SFT: " + " / ".join(GAINS.values()),
        "minutes",
    ]
    return [*table(header, rows), "", sources(*runs)]


def demo_rounds(where: list[tuple[str, str]] = SMOLLM2_RUNS) -> list[str]:
    """Iterated PPO per seed and round: the new on-policy labels, the reward model's accuracy on them before it
    trained on them and after, and the round's last PPO step's reward, KL and held-out gold (the runs of
    ``demo_seeds``, whose table names them)."""
    runs = [Run("demo", *w) for w in where]
    rows = []
    for seed, got in seeds_of(runs):
        for r in got.get("iterated/rounds") or []:
            rows.append(
                [
                    seed,
                    r["round"],
                    r["labels"],
                    f"{r['rm_accuracy_new_pairs']:.3f}",
                    f"{r['rm_accuracy_new_pairs_after_update']:.3f}",
                    f"{r['reward']:.2f}",
                    f"{r['kl']:.2f}",
                    "" if r.get("gold") is None else f"{r['gold']:.2f}",
                ]
            )
    header = ["seed", "round", "new labels", "RM accuracy before", "after", "reward", "KL to SFT", "gold"]
    return table(header, rows)  # the seeds table beside it names the runs


# The built-in tiny model's runs (`bench/demo_seeds.py --threads 1`, the demo's default), every row of the demo.
TINY_RUNS: list[tuple[str, str]] = []
TINY_GAINS = {"ppo": "PPO", "iterated": "iterated PPO", "dpo": "DPO", "online_dpo": "online DPO"}
TINY_PAIRS = (("ppo", "dpo"), ("iterated", "online_dpo"))


def demo_tiny(where: list[tuple[str, str]] | None = None) -> list[str]:
    """The built-in model per seed: SFT's gold, each policy's gain over SFT (± its paired standard error), PPO
    against DPO and iterated PPO against online DPO (each pair at equal labels), the reward model's held-out
    accuracy (ceiling), minutes. Last rows: the mean over seeds ± its standard error, and per comparison the
    paired t-test's p across seeds and how many seeds it won."""
    runs = [Run("demo", *w) for w in (TINY_RUNS if where is None else where)]
    seeds = seeds_of(runs)
    rows = []
    columns: dict[str, list[float]] = {k: [] for k in ("sft", *TINY_GAINS, *map("-".join, TINY_PAIRS), "minutes")}
    for seed, got in seeds:
        cells = [seed, f"{got['gold/sft']:.2f}"]
        columns["sft"].append(got["gold/sft"])
        for name in TINY_GAINS:
            d, se = gain(got, name)
            columns[name].append(d)
            cells.append(f"{d:+.2f} ± {se:.2f}")
        for a, b in TINY_PAIRS:
            d, se = gain(got, a, b)
            columns[f"{a}-{b}"].append(d)
            cells.append(f"{d:+.2f} ± {se:.2f}")
        columns["minutes"].append(got["seconds"] / 60)
        cells += [f"{got['rm/eval_accuracy']:.3f} ({got['rm/label_noise_ceiling']:.3f})", f"{got['seconds'] / 60:.1f}"]
        rows.append(cells)
    if len(rows) > 1:
        gains = (pm(mean_se(columns[k]), sign="+") for k in (*TINY_GAINS, *map("-".join, TINY_PAIRS)))
        rows.append(
            ["mean ± s.e.", pm(mean_se(columns["sft"])), *gains, "", f"{statistics.mean(columns['minutes']):.1f}"]
        )
        tests = []
        for key in map("-".join, TINY_PAIRS):
            p = t_test_p(columns[key])
            won = sum(d > 0 for d in columns[key])
            tests.append(f"{'—' if p is None else f'p = {p:.2f}'}, {won} of {len(columns[key])} seeds")
        rows.append(["paired t-test across seeds", "", "", "", "", "", *tests, "", ""])
    header = ["seed", "gold: SFT", *(f"gain: {label}" for label in TINY_GAINS.values()), "PPO − DPO"]
    header += ["iterated PPO − online DPO", "RM accuracy (ceiling)", "minutes"]
    return [*table(header, rows), "", sources(*runs)]


def demo_stage_times(where: list[tuple[str, str]] | None = None) -> list[str]:
    """The built-in model's stage times per seed (seconds; a stage run beside the others in a child process is
    marked), and the whole demo's minutes (the runs of ``demo_tiny``, whose table names them)."""
    runs = [Run("demo", *w) for w in (TINY_RUNS if where is None else where)]
    seeds = seeds_of(runs)
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
