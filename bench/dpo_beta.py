"""DPO's beta for the support demo, chosen on held-out preference pairs (never on the gold judge).

    python bench/dpo_beta.py --demo-dir runs/demo [--betas 0.03,0.1,0.3] [--model PATH]
    python bench/dpo_beta.py --report bench/reported/dpo_beta.json

From a finished (or half-finished) demo folder, its SFT model and data: `rlhfkit dpo` with the demo's DPO settings
(rlhfkit.demo.plan, for the built-in model or for --model) once per beta, each on all the training pairs; then
each run's accuracy on the held-out pairs (``eval/rewards/accuracy``: the share of held-out pairs whose chosen reply
the policy's implicit reward ranks first) and its held-out DPO loss. The beta with the highest held-out accuracy
is the one to use. The held-out pairs are the raters' noisy labels, as the reward model is measured on; the gold
judge is not read. The result is merged into --out under the machine and the commit (bench/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import results_file
from common import BENCH, Results, log, run_measured
from stamp import Stamp, summary

from rlhfkit.demo.plan import plan


def dpo_command(args, beta: float, out: Path) -> list[str]:
    demo = Path(args.demo_dir)
    options = {**plan(False, args.model).settings["dpo"], "beta": beta}
    data = demo / "data" / ("chat" if (demo / "data" / "chat").is_dir() else "")
    cmd = [sys.executable, "-m", "rlhfkit.cli.main", "dpo", "--model", str(demo / "sft")]
    cmd += ["--data", str(data / "prefs_train.jsonl"), "--eval-data", str(data / "prefs_eval.jsonl")]
    cmd += ["--output-dir", str(out), "--seed", str(args.seed), "--threads", str(args.threads), "--progress", "false"]
    cmd += ["--overwrite-output-dir"]
    for name, value in options.items():
        cmd += [f"--{name.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    return cmd


def held_out(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    last = [r for r in rows if "eval/rewards/accuracy" in r][-1]
    return {"step": last["step"], "accuracy": last["eval/rewards/accuracy"], "loss": last["eval/loss"]}


def print_table(run: dict) -> None:
    print("| beta | held-out accuracy | held-out DPO loss | seconds |")
    print("|---|---|---|---|")
    for beta, got in run["betas"].items():
        print(f"| {beta} | {got['accuracy']:.4f} | {got['loss']:.4f} | {got['seconds']:.0f} |")
    if run.get("chosen") is not None:
        print(f"chosen: beta = {run['chosen']} (highest held-out accuracy)")
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-dir", default="runs/demo", help="a demo's output folder (its sft/ and data/ are used)")
    ap.add_argument("--model", default="", help="the demo's --model (its DPO settings); empty: the built-in one")
    ap.add_argument("--betas", default="0.03,0.1,0.3", help="comma-separated betas, one DPO run each")
    ap.add_argument("--seed", type=int, default=0, help="the DPO runs' seed")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads of each run")
    ap.add_argument("--out", default=str(BENCH / "results" / "dpo_beta.json"), help="the result file to merge into")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "dpo_beta"), help="the runs' folders")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    defaults = vars(ap.parse_args([]))
    results = Results(Path(args.out), Stamp(), "dpo_beta", defaults, args=vars(args), betas={}, chosen=None)
    for beta in [float(b) for b in args.betas.split(",")]:
        out = Path(args.work_dir) / f"beta{beta:g}"
        start = time.perf_counter()
        measured = run_measured(dpo_command(args, beta, out), out.parent / f"{out.name}.log")
        if measured.returncode != 0:
            raise SystemExit(f"beta {beta:g}: DPO failed; its log: {measured.log}")
        results["betas"][f"{beta:g}"] = {**held_out(out), "seconds": round(time.perf_counter() - start, 1)}
        log(f"beta {beta:g}: held-out accuracy {results['betas'][f'{beta:g}']['accuracy']:.4f}")
        results.save()
    results["chosen"] = max(results["betas"], key=lambda b: results["betas"][b]["accuracy"])
    results.close()
    print_table(results)
    print(f"saved to {results.where()}")


if __name__ == "__main__":
    main()
