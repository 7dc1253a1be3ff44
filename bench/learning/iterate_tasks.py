"""Iterated RLHF at its defaults on the built-in tasks with preference data (support, arithmetic, notes): plain PPO,
iterated PPO, offline DPO and online DPO (`rlhfkit iterate --algorithm dpo`) at equal labels, per task and seed,
each policy's gold score against the SFT model's.

Per task and seed, as a user would run the commands (a tiny Llama, everything not listed at its default):

    init-model --arch llama; sft (1000 steps at 3e-3)
    rm on the first 150 offline pairs, and rm on the first 300 (learning rate 1e-3, 3 epochs)
    plain PPO:   ppo --reward-model RM300 --value-model RM300, 90 steps
    iterated:    iterate --reward-model RM150 --judge TASK --rounds 3 --pairs-per-round 50 --max-steps 30
                 (150 offline + 150 on-policy labels; its value model also starts from the reward model);
                 again with --rm-learning-rate 2e-5 (a fixed rate, not the reward model's own), and again
                 with --rm-trust 0 (the KL coefficient never doubled)
    DPO:         dpo on the 300 offline pairs, 2 epochs
    online DPO:  iterate --algorithm dpo --prefs PREFS150 --judge TASK --rounds 3 --pairs-per-round 50
    every policy at --learning-rate 3e-4

So each method sees 300 labels (the task's simulated raters, the same noise offline and online), PPO runs 90
steps with the same critic start, and DPO makes at least one epoch over its labels. Gold is measured by `rlhfkit
eval --gold-judge TASK` on the held-out prompts, 4 samples each, with one sampling seed for every policy; a
policy's gain is paired with SFT's reply by reply (mean and standard error of the differences).

    python -m bench iterate_tasks [--tasks support,arithmetic,notes] [--seeds 0,1,2] [--jobs 2]
    python -m bench iterate_tasks --methods iterated,iterated_carried,online_dpo,online_dpo_carried

`--methods` runs some of them (and the stages they need); besides those above, `iterated_carried` and
`online_dpo_carried` are iterated PPO and online DPO with --carry-optimizer (each round goes on with the last
round's optimizer and one schedule), each paired with its restarting twin reply by reply.
    python -m bench iterate_tasks --report bench/reported/iterate_tasks.json

Each stage is kept in --work-dir and skipped when its output is there, so a stopped run continues. Results merge
into --out (per machine and commit) after every finished task-seed. `--quick`: a few steps of each stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench import results_file, stats
from bench.report.iterate import rows_of
from bench.stamp import Stamp, summary

BENCH = Path(__file__).resolve().parents[1]
RLHFKIT = [sys.executable, "-m", "rlhfkit"]
VARIANTS = {"iterated_fixed_rm_lr": ["--rm-learning-rate", "2e-5"], "iterated_rm_trust_off": ["--rm-trust", "0"]}
CARRY = ["--carry-optimizer", "true"]
METHODS = ("ppo", "iterated", *VARIANTS, "dpo", "online_dpo")  # what a run without --methods runs
ALL_METHODS = (*METHODS, "iterated_carried", "online_dpo_carried")
# a variant read against its twin, reply by reply: name -> (variant, twin)
PAIRED = {
    "iterated_minus_ppo": ("iterated", "ppo"),
    "iterated_carried_minus_restarted": ("iterated_carried", "iterated"),
    "online_dpo_carried_minus_restarted": ("online_dpo_carried", "online_dpo"),
}
ITERATED = {"iterated": [], **VARIANTS, "iterated_carried": CARRY}
ONLINE = {"online_dpo": [], "online_dpo_carried": CARRY}
OFFLINE_FIRST, LABELS = 150, 300
POLICY_LR = "3e-4"
SFT = "--max-steps 1000 --learning-rate 3e-3 --batch-size 16 --warmup-steps 20 --lr-scheduler cosine"
RM = "--learning-rate 1e-3 --num-epochs 3"
ROUNDS = "--rounds 3 --pairs-per-round 50"
EVAL_REPEATS = 4
# --quick: a few steps of each stage, one round of 8 pairs (a wiring check; the flags come last, so they win)
QUICK = {
    "sft": ["--max-steps", 10],
    "rm": ["--max-steps", 4],
    "ppo": ["--max-steps", 2, "--batch-size", 8, "--max-new-tokens", 8],
    "iterate": ["--rounds", 1, "--pairs-per-round", 8, "--max-steps", 1, "--rm-steps", 2, "--batch-size", 8],
    "dpo": ["--max-steps", 4],
    "eval": ["--max-new-tokens", 8],
}
DEFAULTS = {
    "tasks": "support,arithmetic,notes",
    "seeds": "0,1,2",
    "jobs": 2,
    "threads": 1,
    "methods": ",".join(METHODS),
    "quick": False,
}


def run(args: list, log: Path) -> None:
    with log.open("a") as f:
        f.write("$ rlhfkit " + " ".join(map(str, args)) + "\n")
        f.flush()
        done = subprocess.run([*RLHFKIT, *map(str, args)], stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"rlhfkit {args[0]} failed: see {log}")


def stage(path: Path, args: list, log: Path, threads: int, extra: dict | None = None) -> None:
    """Run ``rlhfkit ARGS`` unless ``path`` (what it writes last) is already there; ``extra``: flags to add per
    command (the quick run's)."""
    if not path.exists():
        run([*args, *(extra or {}).get(args[0], []), "--threads", threads], log)


def head(src: Path, dst: Path, n: int) -> Path:
    lines = src.read_text().splitlines(keepends=True)
    if len(lines) < n:
        raise SystemExit(f"{src}: {len(lines)} rows, {n} needed")
    dst.write_text("".join(lines[:n]))
    return dst


def gold_rows(path: Path) -> list[float]:
    return [float(json.loads(line)["gold"]) for line in path.read_text().splitlines() if line.strip()]


def one(
    task_name: str, seed: int, work: Path, threads: int, methods: tuple[str, ...] = METHODS, quick: bool = False
) -> dict:
    """The stages of one task and seed that ``methods`` need (``quick``: QUICK's few steps); returns their gold
    figures and the iterate runs' round records."""
    extra = QUICK if quick else {}
    from rlhfkit.tasks import get_task

    d = work / f"{task_name}-{seed}"
    d.mkdir(parents=True, exist_ok=True)
    log = d / "log.txt"
    start = time.perf_counter()
    files = get_task(task_name).write_data(d / "data", seed=seed)
    prefs_first = head(files["prefs_train"], d / "prefs150.jsonl", OFFLINE_FIRST)
    prefs_all = head(files["prefs_train"], d / "prefs300.jsonl", LABELS)
    prompts = files["prompts_train"]
    eval_prompts = d / "eval_prompts.jsonl"
    eval_prompts.write_text(files["prompts_eval"].read_text() * (1 if quick else EVAL_REPEATS))
    seed_flag = ["--seed", seed, "--progress", "false", "--overwrite-output-dir"]  # a stopped stage starts again
    stage(d / "base" / "config.json", ["init-model", "--arch", "llama", "--corpus", files["corpus"],
          "--output-dir", d / "base", "--seed", seed], log, threads, extra)  # fmt: skip
    sft = d / "sft"
    stage(sft / "model.safetensors", ["sft", "--model", d / "base", "--data", files["sft"], "--output-dir", sft,
          *SFT.split(), *seed_flag], log, threads, extra)  # fmt: skip
    rms = {}
    for n, data in ((OFFLINE_FIRST, prefs_first), (LABELS, prefs_all)):
        rms[n] = d / f"rm{n}"
        if n == LABELS and "ppo" not in methods or n == OFFLINE_FIRST and not set(methods) & set(ITERATED):
            continue
        stage(rms[n] / "reward_stats.json", ["rm", "--model", sft, "--data", data, "--eval-data",
              files["prefs_eval"], "--output-dir", rms[n], *RM.split(), *seed_flag], log, threads, extra)  # fmt: skip
    policies = {
        "ppo": d / "ppo",
        **{name: d / name / "final" for name in ITERATED},
        "dpo": d / "dpo",
        **{name: d / name / "final" for name in ONLINE},
    }
    policies = {name: path for name, path in policies.items() if name in methods}
    common = ["--model", sft, "--learning-rate", POLICY_LR, *seed_flag]
    if "ppo" in methods:
        stage(policies["ppo"] / "model.safetensors", ["ppo", *common, "--reward-model", rms[LABELS], "--value-model",
              rms[LABELS], "--data", prompts, "--max-steps", 90, "--output-dir", d / "ppo"], log, threads, extra)  # fmt: skip
    # each change on its own: the reward model's updates at a fixed 2e-5 instead of its own rate; no KL response;
    # the optimizer carried across rounds
    for name, flags in ITERATED.items():
        if name in methods:
            stage(policies[name] / "model.safetensors", ["iterate", *common, "--reward-model", rms[OFFLINE_FIRST],
                  "--judge", task_name, "--data", prompts, *ROUNDS.split(), "--max-steps", 30, *flags,
                  "--output-dir", d / name], log, threads, extra)  # fmt: skip
    if "dpo" in methods:
        stage(policies["dpo"] / "model.safetensors", ["dpo", *common, "--data", prefs_all, "--num-epochs", 2,
              "--output-dir", d / "dpo"], log, threads, extra)  # fmt: skip
    for name, flags in ONLINE.items():
        if name in methods:
            stage(policies[name] / "model.safetensors", ["iterate", *common, "--algorithm", "dpo", "--prefs",
                  prefs_first, "--judge", task_name, "--data", prompts, *ROUNDS.split(), *flags,
                  "--output-dir", d / name], log, threads, extra)  # fmt: skip
    golds = {}
    for name, model in {"sft": sft, **policies}.items():
        out = d / "eval" / f"{name}.json"
        stage(out, ["eval", "--model", model, "--data", eval_prompts, "--gold-judge", task_name, "--output", out,
              "--seed", 1234], log, threads, extra)  # fmt: skip
        golds[name] = gold_rows(out.with_suffix(".samples.jsonl"))
    result = {"sft_gold": statistics.mean(golds["sft"]), "seconds": round(time.perf_counter() - start)}
    for name in methods:
        gain, gain_se = stats.paired(golds[name], golds["sft"])
        result[name] = {"gold": statistics.mean(golds[name]), "gain": gain, "gain_se": gain_se}
    for name in (m for m in methods if m in ITERATED or m in ONLINE):
        rounds = json.loads((d / name / "summary.json").read_text())["rounds"]
        keys = ("round", "labels", "similar_pairs", "collapsed", "rm_accuracy_new_pairs", "rm_accuracy_heldout_before",
                "rm_accuracy_heldout_after", "reward", "reward_std", "kl", "kl_coef")  # fmt: skip
        result[name]["rounds"] = [{k: r[k] for k in keys if k in r} for r in rounds]
    for key, (a, b) in PAIRED.items():
        if a in methods and b in methods:
            mean, se = stats.paired(golds[a], golds[b])
            result[key] = {"mean": mean, "se": se}
    return result


def print_table(run: dict) -> None:
    print("\n".join(rows_of(run["results"])))
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=DEFAULTS["tasks"], help="comma-separated tasks with raters")
    ap.add_argument("--seeds", default=DEFAULTS["seeds"], help="comma-separated seeds")
    ap.add_argument("--jobs", type=int, default=DEFAULTS["jobs"], help="task-seeds run side by side")
    ap.add_argument("--threads", type=int, default=DEFAULTS["threads"], help="CPU threads of each command")
    ap.add_argument("--methods", default=DEFAULTS["methods"], help=f"comma-separated, of {', '.join(ALL_METHODS)}")
    ap.add_argument("--quick", action="store_true", help="a few steps of each stage: a wiring check")
    ap.add_argument("--work-dir", default=str(BENCH / ".work" / "iterate_tasks"), help="where the runs are kept")
    ap.add_argument("--out", default=str(BENCH / "results" / "iterate_tasks.json"), help="the results file")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    stamp = Stamp()
    tasks, seeds = args.tasks.split(","), [int(s) for s in args.seeds.split(",")]
    methods = tuple(args.methods.split(","))
    if set(methods) - set(ALL_METHODS):
        ap.error(f"--methods: unknown {sorted(set(methods) - set(ALL_METHODS))}; of {', '.join(ALL_METHODS)}")
    settings = {k: getattr(args, k) for k in DEFAULTS}
    key = results_file.run_key(stamp.commit, settings, DEFAULTS)
    machine = results_file.machine_key(stamp.record())
    previous = results_file.read(Path(args.out), "iterate_tasks").get("machines", {}).get(machine, {}).get(key, {})
    run_record = {"tasks": tasks, "seeds": seeds, "results": previous.get("results", {})}
    work = Path(args.work_dir)
    jobs = [(t, s) for t in tasks for s in seeds if f"{t}-{s}" not in run_record["results"]]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(one, t, s, work, args.threads, methods, args.quick): (t, s) for t, s in jobs}
        for future in futures:
            t, s = futures[future]
            try:
                run_record["results"][f"{t}-{s}"] = future.result()
            except Exception as exc:  # one failed task-seed is reported; the others still run
                print(f"{t} seed {s}: {exc}", flush=True)
                continue
            run_record["stamp"] = stamp.record()
            results_file.merge(Path(args.out), "iterate_tasks", machine, key, run_record)
            print(f"{t} seed {s} done", flush=True)
    print_table(run_record)


if __name__ == "__main__":
    main()
