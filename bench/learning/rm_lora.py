"""A pretrained demo's reward model with LoRA against training it in full: held-out accuracy, time, bytes saved.

    python -m bench rm_lora --demo-dir runs/smol --model SmolLM2-135M-Instruct.gguf [--variants full:6e-5,lora:5e-4]
    python -m bench rm_lora --report bench/reported/rm_lora.json

From a demo folder (its SFT model and its data, as `rlhfkit demo --model` wrote them): `rlhfkit rm` with the demo's
reward-model settings for that model (rlhfkit.demo.plan) once per variant, each from the same SFT model on the same
pairs with the same seed: ``full`` trains every weight and saves the whole model; ``lora`` trains rank-16 adapters
and the score head and saves the adapter alone. Each variant's learning rate follows the colon. Per run: the
held-out accuracy at its last step (the raters' labels of the held-out pairs; the label-noise ceiling beside it),
the held-out loss, wall seconds and the bytes it wrote. Merged into --out under the machine and commit.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench import results_file
from bench.harness.runs import BENCH, Results, log, run_measured
from bench.learning.dpo_beta import data_dir, pairs_command
from bench.stamp import Stamp, summary
from rlhfkit.demo.plan import LORA, plan
from rlhfkit.files import read_jsonl
from rlhfkit.tasks.support import label_noise_ceiling


def rm_command(args, variant: str, rate: float, out: Path) -> list[str]:
    options = {**plan(args.quick, args.model).settings["rm"], "learning_rate": rate}
    for key in ("lora_r", "lora_alpha", "save_merged"):
        options.pop(key, None)
    if variant == "lora":
        options.update(LORA, save_merged=False)
    return pairs_command(args, "rm", options, out)


def held_out(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    last = [r for r in rows if "eval/accuracy" in r][-1]
    return {"step": last["step"], "accuracy": last["eval/accuracy"], "loss": last["eval/loss"]}


def written(out: Path) -> int:
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def print_table(run: dict) -> None:
    print(f"label-noise ceiling of the held-out pairs: {run['ceiling']:.3f}")
    print("| reward model | learning rate | held-out accuracy | held-out loss | seconds | MB written |")
    print("|---|---|---|---|---|---|")
    for got in run["variants"].values():
        print(
            f"| {got['variant']} | {got['learning_rate']:g} | {got['accuracy']:.3f} | {got['loss']:.3f} | "
            f"{got['seconds']:.0f} | {got['bytes'] / 1e6:.0f} |"
        )
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-dir", default="runs/demo", help="a demo's output folder (its sft/ and data/ are used)")
    ap.add_argument("--model", required=False, default="", help="the demo's --model (its reward-model settings)")
    ap.add_argument("--variants", default="full:6e-5,lora:5e-4", help="comma-separated full:RATE or lora:RATE")
    ap.add_argument("--seed", type=int, default=0, help="the runs' seed")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads of each run")
    ap.add_argument("--quick", action="store_true", help="the demo's --quick settings: a wiring check")
    ap.add_argument("--out", default=str(BENCH / "results" / "rm_lora.json"), help="the result file to merge into")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "rm_lora"), help="the runs' folders")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    defaults = vars(ap.parse_args([]))
    ceiling = label_noise_ceiling(read_jsonl(data_dir(Path(args.demo_dir)) / "prefs_eval.jsonl"))
    results = Results(Path(args.out), Stamp(), "rm_lora", defaults, args=vars(args), variants={}, ceiling=ceiling)
    for item in args.variants.split(","):
        variant, rate = item.split(":")
        if variant not in ("full", "lora"):
            raise SystemExit(f"--variants: {variant!r} is neither full nor lora")
        out = Path(args.work_dir) / f"{variant}-{rate}"
        start = time.perf_counter()
        measured = run_measured(rm_command(args, variant, float(rate), out), out.parent / f"{out.name}.log")
        if measured.returncode != 0:
            raise SystemExit(f"{item}: rm failed; its log: {measured.log}")
        got = {**held_out(out), "seconds": round(time.perf_counter() - start, 1), "bytes": written(out)}
        results["variants"][item] = {"variant": variant, "learning_rate": float(rate), **got}
        log(f"{item}: held-out accuracy {got['accuracy']:.4f} in {got['seconds']:.0f}s")
        results.save()
    results.close()
    print_table(results)
    print(f"saved to {results.where()}")


if __name__ == "__main__":
    main()
