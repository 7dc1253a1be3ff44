"""docs/demo.md's tables of `rlhfkit demo` over seeds (bench/demo_seeds.py, bench/reported/demo.json): the gold
each policy gained over SFT seed by seed, and iterated PPO's reward model round by round. Standard library only."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from iterate_tables import t_test_p
from table_parts import AVX2, AVX512_RECORDED, XEON_AMX, Run, every_run, load, mean_se, pm, sources, table

# SmolLM2-135M-Instruct (machine key, run key); a list's seeds are shown together. The current plan (600 labels,
# 16 PPO steps, 2 rounds; rlhfkit/demo/plan.py):
SMOLLM2_PLAN_RUNS = [
    (XEON_AMX, "7c39c7204a2d --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0,1"),
    (XEON_AMX, "66017a9c3c4a --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 2,3"),  # seed 2 (3 was stopped)
    (XEON_AMX, "680482b120fa --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 3,4"),  # seed 3 (continued; 4 stopped)
    (XEON_AMX, "3a3fa27fdfff --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 4"),
]
# Seeds of the same plan run again, DPO and PPO without their own held-out evaluations (--eval-steps -1) and the
# evaluation's KL from the sampler's log-probs: (seed, first run, rerun).
SMOLLM2_PLAN_RERUNS = [
    (
        "4",
        (XEON_AMX, "3a3fa27fdfff --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 4"),
        (XEON_AMX, "d1889e4afd45 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 4"),
    ),
    (
        "0",
        (XEON_AMX, "7c39c7204a2d --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0,1"),
        (XEON_AMX, "67b6c3ccb1a4 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0"),
    ),
]
# Seeds of the plan on one thread a stage (--threads 1: two stages at once, the stages alone on both cores)
# against their reruns on two (--threads 2, every stage alone): (seed, --threads 2, --threads 1). Seed 4's
# --threads 2 run predates the evaluation's KL from the sampler's log-probs.
SMOLLM2_THREADS_RUNS = [
    (
        "0",
        (XEON_AMX, "67b6c3ccb1a4 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0"),
        (XEON_AMX, "983135fa7337 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0 --threads 1"),
    ),
    (
        "4",
        (XEON_AMX, "d1889e4afd45 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 4"),
        (XEON_AMX, "b8529998b118 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 4 --threads 1"),
    ),
]
# LoRA on every stage with 1200 labels, 30 PPO steps and 3 rounds; its stages ran from the code of commit e8080e4
# and its evaluation from 42b2fce (the demo's --resume):
SMOLLM2_LORA_RUNS = [(XEON_AMX, "42b2fcea3a92 --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0")]
# An earlier plan: plain PPO's value function a head on the policy, DPO on 800 of its 1200 labels, no online DPO,
# the reward model in full.
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


def demo_seeds(where: list[tuple[str, str]] = SMOLLM2_RUNS) -> list[str]:
    """Per seed: SFT's gold, each policy's gain over SFT (± its paired standard error), PPO's and iterated PPO's
    lead over DPO, the reward model's held-out accuracy and the label-noise ceiling, KL to SFT, minutes. Last
    row: the mean over seeds ± its standard error."""
    runs = [Run("demo", *w) for w in where]
    rows, columns = [], {k: [] for k in ("sft", *GAINS, "ppo-dpo", "iterated-dpo", "rm", "minutes")}
    for seed, got in seeds_of(runs):
        cells = [seed, f"{got['gold/sft']:.2f}"]
        columns["sft"].append(got["gold/sft"])
        cells += gain_cells(got, [(name, "sft") for name in GAINS], columns)
        cells += gain_cells(got, [("ppo", "dpo"), ("iterated", "dpo")], columns)
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
                    after(r),
                    f"{r['reward']:.2f}",
                    f"{r['kl']:.2f}",
                    "" if r.get("gold") is None else f"{r['gold']:.2f}",
                ]
            )
    header = ["seed", "round", "new labels", "RM accuracy before", "after", "reward", "KL to SFT", "gold"]
    return table(header, rows)  # the seeds table beside it names the runs


def after(r: dict) -> str:
    """The reward model's accuracy after a round's update: on the round's new pairs (what earlier code measured),
    else on the share of them held out of its training (marked "held out")."""
    if "rm_accuracy_new_pairs_after_update" in r:
        return f"{r['rm_accuracy_new_pairs_after_update']:.3f}"
    if r.get("rm_accuracy_heldout_after") is None:
        return "—"
    return f"{r['rm_accuracy_heldout_after']:.3f} (held out)"


# The built-in tiny model's runs (`bench/demo_seeds.py --threads 1`, the demo's default), every row of the demo.
TINY_RUNS = [(XEON_AMX, "c167025e2dce --seeds 0,1,2,3,4 --threads 1")]
# The same seeds before SFT and the evaluation took both cores (SFT on one thread: other weights, so other
# numbers throughout); bench/dpo_beta.py --gold read these runs' demo folders.
TINY_RUNS_ONE_THREAD = [(XEON_AMX, "cae858a7075c --seeds 0,1,2,3,4 --threads 1")]
# The same seeds on earlier code still, the stages in another order (beta = 0 beside PPO and DPO, online DPO
# beside iterated PPO): the same numbers as TINY_RUNS_ONE_THREAD.
TINY_RUNS_BEFORE = [(XEON_AMX, "b0b078c263dc --seeds 0,1,2,3,4 --threads 1")]
# The same plan with DPO's and online DPO's beta at 0.1, before it was chosen on held-out pairs.
TINY_BETA_01_RUNS = [(AVX512_RECORDED, "d0fc6e7e93a6 --seeds 0,1 --threads 1")]
TINY_GAINS = {"ppo": "PPO", "iterated": "iterated PPO", "dpo": "DPO", "online_dpo": "online DPO"}
TINY_PAIRS = (("ppo", "dpo"), ("iterated", "online_dpo"))


def p_text(p: float | None) -> str:
    """A p-value as the tables print it (small ones as a bound; Simpson's rule is not exact down there)."""
    if p is None:
        return "—"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.01 else f"p = {p:.2f}"


def demo_tiny(where: list[tuple[str, str]] | None = None, kl: bool = False) -> list[str]:
    """Per seed: SFT's gold, each policy's gain over SFT (± its paired standard error), PPO against DPO and
    iterated PPO against online DPO (each pair at equal labels), the reward model's held-out accuracy (ceiling),
    with ``kl`` each policy's KL to SFT, minutes. Last rows: the mean over seeds ± its standard error, and per
    comparison the paired t-test's p across seeds and how many seeds it won. ``where``: the runs (the built-in
    model's, TINY_RUNS, by default)."""
    runs = [Run("demo", *w) for w in (TINY_RUNS if where is None else where)]
    seeds = seeds_of(runs)
    rows = []
    columns: dict[str, list[float]] = {k: [] for k in ("sft", *TINY_GAINS, *map("-".join, TINY_PAIRS), "minutes")}
    for seed, got in seeds:
        cells = [seed, f"{got['gold/sft']:.2f}"]
        columns["sft"].append(got["gold/sft"])
        cells += gain_cells(got, [(name, "sft") for name in TINY_GAINS], columns)
        cells += gain_cells(got, TINY_PAIRS, columns)
        columns["minutes"].append(got["seconds"] / 60)
        cells.append(f"{got['rm/eval_accuracy']:.3f} ({got['rm/label_noise_ceiling']:.3f})")
        if kl:
            cells.append(" / ".join(f"{got[f'kl/{n}']:.1f}" for n in TINY_GAINS))
        cells.append(f"{got['seconds'] / 60:.1f}")
        rows.append(cells)
    blank = [""] * kl
    if len(rows) > 1:
        gains = (pm(mean_se(columns[k]), sign="+") for k in (*TINY_GAINS, *map("-".join, TINY_PAIRS)))
        rows.append(
            [
                "mean ± s.e.",
                pm(mean_se(columns["sft"])),
                *gains,
                "",
                *blank,
                f"{statistics.mean(columns['minutes']):.1f}",
            ]
        )
        tests = []
        for key in map("-".join, TINY_PAIRS):
            p = t_test_p(columns[key])
            won = sum(d > 0 for d in columns[key])
            tests.append(f"{p_text(p)}, {won} of {len(columns[key])} seeds")
        rows.append(["paired t-test across seeds", "", "", "", "", "", *tests, "", *blank, ""])
    header = ["seed", "gold: SFT", *(f"gain: {label}" for label in TINY_GAINS.values()), "PPO − DPO"]
    header += ["iterated PPO − online DPO", "RM accuracy (ceiling)"]
    header += ["KL to SFT: " + " / ".join(TINY_GAINS.values())] * kl + ["minutes"]
    return [*table(header, rows), "", sources(*runs)]


def demo_stage_times(where: list[tuple[str, str]] | None = None) -> list[str]:
    """Stage times per seed (seconds; a stage run beside the others in a child process is marked), and the whole
    demo's minutes: the runs ``where`` (the built-in model's, TINY_RUNS, by default; the gains table beside it
    names them)."""
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
    if any(got.get("stage_code") for _, got in seeds):  # runs since stages record their code
        codes = [dict.fromkeys(c or "not recorded" for c in (got.get("stage_code") or {}).values()) for _, got in seeds]
        rows.append(["code of the stages"] + ["; ".join(c) or "not recorded" for c in codes])
    return table(["stage", *(f"seed {seed}: seconds" for seed, _ in seeds)], rows)


def demo_tiny_again(
    before: list[tuple[str, str]] = TINY_RUNS_BEFORE, now: list[tuple[str, str]] | None = None
) -> list[str]:
    """The same seeds run twice (``before``, then ``now``: TINY_RUNS_ONE_THREAD by default): per seed the whole
    demo's minutes in each, whether every gold, reward-model and accuracy number of the two summaries is equal,
    and the largest difference between their KLs to SFT."""
    first, again = (
        [Run("demo", *w) for w in where] for where in (before, TINY_RUNS_ONE_THREAD if now is None else now)
    )
    a, b = dict(seeds_of(first)), dict(seeds_of(again))
    rows = []
    for seed in sorted(set(a) & set(b), key=int):
        x, y = a[seed], b[seed]
        keys = [k for k in x if k.startswith(("gold/", "gold_se/", "rm/")) and isinstance(x[k], float)]
        same = all(x[k] == y.get(k) for k in keys)
        kl = max(abs(x[k] - y[k]) for k in x if k.startswith("kl/") and isinstance(x[k], float))
        rows.append(
            [seed, f"{x['seconds'] / 60:.1f}", f"{y['seconds'] / 60:.1f}", "yes" if same else "no", f"{kl:.0e}"]
        )
    header = ["seed", "minutes: first run", "minutes: again", "gold, RM numbers equal", "largest KL difference"]
    return [*table(header, rows), "", sources(*first, *again)]


def code_of(run: Run, got: dict) -> str:
    """The code a seed's stages ran: as the seed recorded it, else the commit the run's key starts with."""
    codes = dict.fromkeys(c for c in (got.get("stage_code") or {}).values() if c)
    return "; ".join(codes) or f"git {run.key.split()[0]}"


def demo_rerun(
    reruns: list[tuple[str, tuple[str, str], tuple[str, str]]] = SMOLLM2_PLAN_RERUNS,
    labels: tuple[str, str] = ("first run", "again"),
) -> list[str]:
    """Seeds run twice (``reruns``: seed, the first run, the rerun; ``labels`` name the two): per seed each
    stage's seconds in both runs and the difference, the whole demo's minutes, and each policy's gold gain over
    SFT in both (the same models give the same numbers)."""
    header, rows, runs = ["stage"], {}, []
    for seed, *where in reruns:
        first, again = (Run("demo", *w) for w in where)
        runs += [first, again]
        a, b = first["seeds"][seed], again["seeds"][seed]
        header += [f"seed {seed}: {labels[0]} ({code_of(first, a)})", f"{labels[1]} ({code_of(again, b)})"]
        header.append("difference")
        for name in a["stage_seconds"]:
            x, y = a["stage_seconds"][name], b["stage_seconds"][name]
            rows.setdefault(name, []).extend([f"{x:.0f}", f"{y:.0f}", f"{y - x:+.0f}"])
        x, y = a["seconds"] / 60, b["seconds"] / 60
        rows.setdefault("whole demo (minutes)", []).extend([f"{x:.1f}", f"{y:.1f}", f"{y - x:+.1f}"])
        for name, label in (*GAINS.items(), ("online_dpo", "online DPO")):
            x, y = gain(a, name)[0], gain(b, name)[0]
            rows.setdefault(f"gold gain: {label}", []).extend([f"{x:+.3f}", f"{y:+.3f}", f"{y - x:+.3f}"])
    return [*table(header, [[name, *cells] for name, cells in rows.items()]), "", sources(*runs)]


# bench/dpo_beta.py's runs on the built-in model's demo folders (every run of the file on that machine is shown).
BETA_MACHINE = AVX512_RECORDED


def of_model(run: Run, model: str) -> bool:
    """Whether a bench/dpo_beta.py run was on the demo of ``model`` (a file or folder name; "": the built-in)."""
    return Path(run["args"].get("model") or "").name == model


def dpo_beta(machine: str | None = None, model: str = "") -> list[str]:
    """DPO's held-out preference accuracy and held-out DPO loss (the held-out labels' negative log-likelihood
    under the policy's implicit Bradley-Terry model) per beta and demo seed (bench/dpo_beta.py on the demo of
    ``model``, "" the built-in one; a seed's betas may come from several runs), with their means over seeds; the
    best mean of each is in bold."""
    machine = BETA_MACHINE if machine is None else machine
    runs = [Run("dpo_beta", machine, key) for key in load("dpo_beta")["machines"][machine]]
    runs = [run for run in runs if of_model(run, model) and not run.data.get("gold")]
    got: dict[float, dict[int, dict]] = {}
    for run in runs:
        for beta, r in run["betas"].items():
            got.setdefault(float(beta), {})[int(run["args"]["seed"])] = r
    seeds = sorted({s for by_seed in got.values() for s in by_seed})
    full = [b for b in sorted(got) if len(got[b]) == len(seeds)]
    acc = {b: statistics.mean(r["accuracy"] for r in got[b].values()) for b in full}
    loss = {b: statistics.mean(r["loss"] for r in got[b].values()) for b in full}
    best_acc, best_loss = max(acc, key=acc.get), min(loss, key=loss.get)

    def bold(text: str, on: bool) -> str:
        return f"**{text}**" if on else text

    rows = []
    for b in sorted(got):
        cells = [f"{b:g}"]
        cells += [f"{got[b][s]['accuracy']:.4f}" if s in got[b] else "—" for s in seeds]
        cells.append(bold(f"{acc[b]:.4f}", acc[b] == acc[best_acc]) if b in acc else "—")  # ties all in bold
        cells += [f"{got[b][s]['loss']:.3f}" if s in got[b] else "—" for s in seeds]
        cells.append(bold(f"{loss[b]:.3f}", loss[b] == loss[best_loss]) if b in loss else "—")
        rows.append(cells)
    header = ["β", *(f"accuracy: seed {s}" for s in seeds), "mean", *(f"loss: seed {s}" for s in seeds), "mean"]
    return [*table(header, rows), "", sources(*runs)]


# bench/dpo_beta.py --gold on the seeds of TINY_RUNS_ONE_THREAD (their demo folders), read after beta was fixed.
BETA_GOLD_MACHINE = XEON_AMX
TINY_DPO_BETA = 3.0  # the beta of DPO in the plan that made TINY_RUNS_ONE_THREAD (rlhfkit/demo/plan.py)


def dpo_beta_gold(machine: str | None = None) -> list[str]:
    """Per beta, over the seeds of the demo runs (mean ± its standard error): DPO's held-out preference accuracy
    and held-out loss (what beta is chosen on), its gold gain over SFT, PPO's lead over it (the paired t-test's p
    across seeds, the seeds PPO led in) and its KL to SFT: the runs of bench/dpo_beta.py --gold on the demo's SFT
    models, and for a beta they lack, the demo's own DPO from TINY_RUNS_ONE_THREAD (gold only)."""
    machine = BETA_GOLD_MACHINE if machine is None else machine
    data = load("dpo_beta")["machines"].get(machine, {})
    runs = [Run("dpo_beta", machine, key) for key, run in data.items() if run.get("gold")]
    runs = [run for run in runs if of_model(run, "")]
    got: dict[float, dict[int, dict]] = {}
    for run in runs:
        for beta, r in run["betas"].items():
            g = r["gold"]
            got.setdefault(float(beta), {})[int(run["args"]["seed"])] = {
                "accuracy": r["accuracy"],
                "loss": r["loss"],
                "gain": g["gain"]["mean"],
                "lead": g["ppo_minus_dpo"]["mean"],
                "kl": g["kl"],
            }
    demo = [] if TINY_DPO_BETA in got else [Run("demo", *w) for w in TINY_RUNS_ONE_THREAD]
    for seed, summary in seeds_of(demo):
        got.setdefault(TINY_DPO_BETA, {})[int(seed)] = {
            "gain": gain(summary, "dpo")[0],
            "lead": gain(summary, "ppo", "dpo")[0],
            "kl": summary["kl/dpo"],
        }
    rows = []
    for beta in sorted(got):
        by_seed = list(got[beta].values())

        def column(key: str, digits: int = 2, sign: str = "", rows=by_seed) -> str:
            values = [r[key] for r in rows if key in r]
            return pm(mean_se(values), digits, sign) if len(values) == len(rows) else "—"

        leads = [r["lead"] for r in by_seed]
        note = " (the demo's)" if beta == TINY_DPO_BETA else ""
        rows.append(
            [
                f"{beta:g}{note}",
                str(len(by_seed)),
                column("accuracy", 3),
                column("loss", 3),
                column("gain", sign="+"),
                column("lead", sign="+"),
                f"{p_text(t_test_p(leads))}, {sum(d > 0 for d in leads)} of {len(leads)}",
                f"{statistics.mean(r['kl'] for r in by_seed):.2f}",
            ]
        )
    header = ["DPO's β", "seeds", "held-out accuracy", "held-out loss", "DPO: gold gain over SFT", "PPO − DPO"]
    header += ["PPO ahead: t-test, seeds", "DPO: KL to SFT"]
    return [*table(header, rows), "", sources(*runs, *demo)]


def rm_lora() -> list[str]:
    """The pretrained demo's reward model trained with LoRA against in full (bench/rm_lora.py): every run in
    bench/reported/rm_lora.json, one row per variant, with the held-out pairs' label-noise ceiling."""
    runs = every_run("rm_lora")
    rows = []
    for run in runs:
        for got in run["variants"].values():
            rows.append(
                [
                    run["args"]["seed"],
                    "LoRA r = 16, score head in full" if got["variant"] == "lora" else "in full",
                    f"{got['learning_rate']:g}",
                    f"{got['accuracy']:.3f} ({run['ceiling']:.3f})",
                    f"{got['loss']:.3f}",
                    f"{got['seconds']:.0f}",
                    f"{got['bytes'] / 1e6:.0f}",
                ]
            )
    header = [
        "seed",
        "reward model",
        "learning rate",
        "held-out accuracy (ceiling)",
        "held-out loss",
        "seconds",
        "MB saved",
    ]
    return [*table(header, rows), "", sources(*runs)]


def adapter_load() -> list[str]:
    """Loading a LoRA adapter chain with rlhfkit's direct merge against PEFT's (bench/adapter_load.py): every run in
    bench/reported/adapter_load.json, one row per model folder (named by its place in the demo's folder)."""
    runs = every_run("adapter_load")
    rows = []
    for run in runs:
        for got in run["models"].values():
            parts = got["model"].rstrip("/").split("/")
            name = "/".join(parts[-2:]) if parts[-1] == "final" else parts[-1]
            rows.append(
                [
                    name,
                    got["adapters"],
                    f"{got['direct_s']:.1f}",
                    f"{got['peft_s']:.1f}",
                    "0 (the same)" if got["max_difference"] == 0 else f"{got['max_difference']:.1g}",
                ]
            )
    header = ["model", "adapters in its chain", "seconds: direct merge", "seconds: PEFT's merge", "weight difference"]
    return [*table(header, rows), "", sources(*runs)]


def across_seeds(diffs: list[float]) -> str:
    """Per-seed differences as the tables give them: mean ± s.e. (the paired t-test's p, the seeds ahead)."""
    return f"{pm(mean_se(diffs), sign='+')} ({p_text(t_test_p(diffs))}, ahead in {sum(d > 0 for d in diffs)} of {len(diffs)})"


def ppo_critic(benchmark: str = "ppo_critic", demo_runs: list[tuple[str, str]] = SMOLLM2_PLAN_RUNS) -> list[str]:
    """PPO's value function on the pretrained demo: ``critic_table`` of every run of bench/ppo_critic.py's file,
    with each variant's gain less the DPO gain of the demo runs ``demo_runs`` (each seed's own DPO, from the same
    SFT model and labels)."""
    runs = every_run(benchmark)
    demo_list = [Run("demo", *w) for w in demo_runs]
    dpo = {int(seed): got for seed, got in seeds_of(demo_list)}
    return [*critic_table([run.data for run in runs], dpo), "", sources(*runs, *demo_list)]


def critic_table(runs: list[dict], dpo: dict[int, dict] | None = None) -> list[str]:
    """bench/ppo_critic.py's runs: per seed and variant, the demo's own PPO (a separate value model started from
    the reward model) and the variant run again from the same SFT model, reward model and settings, both evaluated
    as the demo evaluates: gold gained over SFT, KL to SFT, median seconds a PPO step, and the variant's gold less
    the demo's PPO's (paired over the same replies, ± s.e.); then per variant the means over seeds ± s.e. with
    ``across_seeds``'s test, and with ``dpo`` (demo summaries by seed) the same for the variant's gain less DPO's."""
    by_variant: dict[str, dict[int, tuple[dict, dict]]] = {}
    demo: dict[int, dict] = {}  # per seed, what any run recorded of the demo's own PPO
    for run in runs:
        for seed, got in run["seeds"].items():
            for key, value in got.items():
                if value is not None:
                    demo.setdefault(int(seed), {}).setdefault(key, value)
            for variant, x in got.get("variants", {}).items():
                by_variant.setdefault(variant, {})[int(seed)] = (got, x)

    def number(value, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    header = ["variant", "seed", "value model: gain", "KL", "s a step", "variant: gain", "KL", "s a step"]
    header.append("variant − value model")
    rows = []
    for variant in sorted(by_variant):
        critic, steps = variant.split(":")
        name = f"{'value head' if critic == 'head' else 'value model'}, {steps} steps"
        demo_gains, gains, diffs = [], [], []
        for seed, (got, x) in sorted(by_variant[variant].items()):
            demo_gains.append(got["gold/ppo"] - got["gold/sft"])
            gains.append(x["gain"]["mean"])
            diffs.append(x["minus_demo_ppo"]["mean"])
            rows.append(
                [
                    "" if len(gains) > 1 else name,  # the variant's name on its first row
                    str(seed),
                    f"{demo_gains[-1]:+.2f}",
                    number(demo[seed].get("demo_kl/ppo")),
                    number(demo[seed].get("demo_ppo_step_seconds"), 1),
                    pm((x["gain"]["mean"], x["gain"]["se"]), sign="+"),
                    number(x["kl"]),
                    number(x["step_seconds"], 1),
                    pm((x["minus_demo_ppo"]["mean"], x["minus_demo_ppo"]["se"]), sign="+"),
                ]
            )
        mean = ["mean", f"{len(diffs)} seeds", pm(mean_se(demo_gains), sign="+"), "", ""]
        rows.append([*mean, pm(mean_se(gains), sign="+"), "", "", across_seeds(diffs)])
        if dpo is not None:
            over_dpo = [x["gain"]["mean"] - gain(dpo[seed], "dpo")[0] for seed, (_, x) in by_variant[variant].items()]
            rows.append(["− the demo's DPO", "", *[""] * 6, across_seeds(over_dpo)])
    return table(header, rows)
