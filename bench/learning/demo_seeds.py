"""`rlhfkit demo` over several seeds: each run's gold scores, KL, reward-model accuracy (offline and, round by
round, on iterated PPO's on-policy pairs) and stage times, filed in one result file.

    python -m bench demo --model SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0,1,2 --threads 2 [--kl-ablation true]
    python -m bench demo --report bench/reported/demo.json [--run TEXT]

Per seed, one after the other: `rlhfkit demo [--model PATH] --seed S --threads T --progress false` in a child
process, exactly as a user runs it (its output under --work-dir/seedS, its log beside it), then the run's
summary.json without its sample replies. A seed whose folder already holds a finished run of the same model and
seed (summary.json) is read, not run again: a run started by hand with that command, or one an interrupted
benchmark finished; one it left half done continues at its first unfinished stage (the demo's --resume). The result carries a stamp (bench/stamp.py) and is merged into --out after every seed
(bench/results_file.py); bench/tables.py renders docs/demo.md's tables from it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench import results_file
from bench.harness.runs import BENCH, ROOT, Results, log
from bench.stamp import Stamp, summary

POLICIES = ("sft", "ppo", "ppo_no_kl", "dpo", "iterated", "online_dpo")
SAMPLES = ("samples",)  # the report's sample replies: not numbers


def demo_command(args, seed: int, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "rlhfkit.cli.main", "demo", "--seed", str(seed), "--output-dir", str(out)]
    if args.model:
        cmd += ["--model", args.model]
    if args.quick:
        cmd.append("--quick")
    if args.kl_ablation is not None:  # part of the run's identity: a seed half done with it continues only with it
        cmd += ["--kl-ablation", args.kl_ablation]
    # --resume: a seed an interrupted benchmark left half done continues at its first unfinished stage
    return [*cmd, "--threads", str(args.threads), "--progress", "false", "--resume"]


def finished(out: Path, args, seed: int) -> dict | None:
    """The summary of a finished run of this model and seed in ``out``, else None."""
    path = out / "summary.json"
    if not path.exists():
        return None
    got = json.loads(path.read_text())
    same_model = Path(got.get("model") or "").name == Path(args.model or "").name
    if not same_model or got.get("seed", seed) != seed or bool(got.get("quick")) != args.quick:
        return None
    return got


def one_seed(args, seed: int, results: Results) -> None:
    out = Path(args.work_dir) / f"seed{seed}"
    got = finished(out, args, seed)
    if got is None:
        cmd = demo_command(args, seed, out)
        log(f"seed {seed}: {' '.join(cmd[2:])} (log: {out}.log)")
        start = time.perf_counter()
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{out}.log", "w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"seed {seed}: the demo failed (exit {done.returncode}); its log: {out}.log")
        got = json.loads((out / "summary.json").read_text())
        got["wall_seconds"] = time.perf_counter() - start
    else:
        log(f"seed {seed}: a finished run in {out}, read")
    results["seeds"][str(seed)] = {k: v for k, v in got.items() if k not in SAMPLES}
    results.save()


def print_table(run: dict) -> None:
    seeds = run["seeds"]
    print(f"seeds {', '.join(seeds)}")
    for seed, got in seeds.items():
        sft = got["gold/sft"]
        gains = ", ".join(
            f"{p} {got[f'gold/{p}'] - sft:+.2f}" for p in POLICIES[1:] if got.get(f"gold/{p}") is not None
        )
        rounds = got.get("iterated/rounds") or []
        before = " / ".join(f"{r['rm_accuracy_new_pairs']:.2f}" for r in rounds)
        print(
            f"seed {seed}: SFT gold {sft:.2f}; gains {gains}; RM accuracy {got['rm/eval_accuracy']:.3f} "
            f"(ceiling {got['rm/label_noise_ceiling']:.3f}); on new pairs before training {before}; "
            f"{got['seconds'] / 60:.0f} min"
        )
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a pretrained model (folder or .gguf); empty: the built-in one")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, run one after the other")
    ap.add_argument("--threads", type=int, default=2, help="the demo's --threads")
    ap.add_argument("--quick", action="store_true", help="the demo's --quick (a wiring check; numbers mean nothing)")
    ap.add_argument(
        "--kl-ablation",
        choices=("true", "false"),
        default=None,
        help="the demo's --kl-ablation (the beta = 0 run); unset: the demo's default (off with --model)",
    )
    ap.add_argument(
        "--out",
        default=str(BENCH / "results" / "demo.json"),
        help="the benchmark's JSON file: this run is merged into it under its machine and run key",
    )
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "demo"), help="the demo runs' folders")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:  # --report: printed
        return
    stamp = Stamp()
    defaults = vars(ap.parse_args([]))
    record = dict(vars(args), model=Path(args.model).name if args.model else "")
    results = Results(Path(args.out), stamp, "demo", dict(defaults, model=""), args=record)
    results.update(seeds={})
    for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
        one_seed(args, seed, results)
    results.close()
    print_table(results)
    print(f"\nresults: {results.where()}")


if __name__ == "__main__":
    main()
