"""The matmul floor of a full-fine-tuning GRPO step on SmolLM2, beside the measured steps of rlhfkit and TRL.

    python -m bench.experiments.grpo_floor --results FILE.json [--run TEXT] [--threads 2] [--speed-up 2.5]

Reads the `grpo` row of a bench/vs_trl/real_model.py run (both frameworks) and counts the matmul FLOPs of one step of
its settings over real tokens: the step's distinct prompts once each (the completions of a prompt share its
keys and values in generation and its copy in the packed teacher-forced passes) and the tokens rlhfkit
generated, as logged per step. The phases, in rlhfkit's logged names:

  generate   prefill of each distinct prompt + one decode token at a time with the KV cache, B rows at once
  forward    the policy's forward with gradients (the update reuses it) and the reference's forward
  update     the policy's backward, ~2x its forward (gradients of the inputs and of the weights)

Each phase's FLOPs are divided by the matmul rate measured here at its shapes (bench/speed/flops.py's
`measure_matmul_rate`: decode rows for generation, the step's real tokens for the rest). AdamW's update and the
elementwise work are left out, so the floor is a lower bound. The table shows what a step of rlhfkit would take
to be `--speed-up` times TRL's measured step, against that floor.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from bench import results_file
from bench.speed import flops
from bench.stamp import summary
from bench.vs_trl import grpo_vs_trl

BENCH = Path(__file__).resolve().parents[1]


def grpo_step_flops(s: dict, groups: int, group_size: int, prompt: float, generated: float) -> dict[str, float]:
    """Matmul FLOPs of one GRPO step (one update per batch, a reference model): ``groups`` distinct prompts of
    ``prompt`` tokens, ``group_size`` completions each, ``generated`` tokens generated in all."""
    rows = groups * group_size
    per_row = generated / rows
    prefill = groups * prompt * flops.per_token_flops(s, prompt / 2, head=False)
    prefill += groups * 2 * s["d"] * s["vocab"]  # the LM head at each prompt's last position
    decode = generated * flops.per_token_flops(s, prompt + per_row / 2)
    tokens = groups * prompt + generated
    body = tokens * flops.per_token_flops(s, (prompt + per_row) / 2, head=False)
    policy = body + (generated + rows) * 2 * s["d"] * s["vocab"]  # LM head on the response positions only
    return {"generate": prefill + decode, "forward": 2 * policy, "update": 2 * policy}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="a bench/vs_trl/real_model.py results file")
    ap.add_argument("--run", default="", help="the run whose machine / run key contains this text (default: last)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speed-up", type=float, default=2.5, help="the speed-up over TRL to compare with the floor")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work"), help="where real_model put its data")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    picked = [
        (m, k, r)
        for m, k, r in results_file.select(results_file.read(Path(args.results)), args.run)
        if "grpo" in r.get("rows", {})
    ]
    if not picked:
        raise SystemExit(f"grpo_floor: no run with a grpo row in {args.results} matching {args.run!r}")
    machine, key, run = picked[-1]
    ours, theirs = run["rows"]["grpo"]["rlhfkit"], run["rows"]["grpo"].get("trl", [])
    settings = run["settings"]["grpo"]
    rows, group_size = settings["batch_size"], settings["num_generations"]
    s = flops.model_shapes(run["models"]["sft"])
    _, ids = grpo_vs_trl.prompts_and_ids(run["models"]["sft"], Path(args.work_dir) / "data" / "prompts_train.jsonl")
    prompt = statistics.mean(len(p) for p in ids)
    generated = statistics.mean(t for r in ours for t in r["generated_tokens"][1:])
    counted = grpo_step_flops(s, rows // group_size, group_size, prompt, generated)
    tokens = round((rows // group_size) * prompt + generated)
    rates = {
        "decode": flops.measure_matmul_rate(s, rows),
        "teacher-forced": flops.measure_matmul_rate(s, tokens),
    }
    floor = {
        "generate": counted["generate"] / rates["decode"] / 1e9,
        "forward": counted["forward"] / rates["teacher-forced"] / 1e9,
        "update": counted["update"] / rates["teacher-forced"] / 1e9,
    }
    measured = {p: statistics.mean(r["phases"][f"time/{p}_s"] for r in ours) for p in floor}
    step = statistics.mean(r["step_s"] for r in ours)
    print(f"run: {machine} / {key}")
    print(
        f"{rows} completions of {generated / rows:.1f} tokens on average, {rows // group_size} prompts of {prompt:.1f}"
        f" tokens; matmul rate here: {rates['decode']:.0f} GFLOP/s at {rows} rows (decode), "
        f"{rates['teacher-forced']:.0f} at {tokens} (teacher-forced)\n"
    )
    print(f"{'phase':<10} {'GFLOP':>8} {'floor s':>8} {'rlhfkit s':>10} {'÷ floor':>8}")
    for phase, seconds in floor.items():
        print(
            f"{phase:<10} {counted[phase] / 1e9:>8.1f} {seconds:>8.2f} {measured[phase]:>10.2f} "
            f"{measured[phase] / seconds:>7.2f}x"
        )
    total = sum(floor.values())
    print(f"{'step':<10} {sum(counted.values()) / 1e9:>8.1f} {total:>8.2f} {step:>10.2f} {step / total:>7.2f}x")
    if theirs:
        trl = statistics.mean(r["step_s"] for r in theirs)
        need = trl / args.speed_up
        print(
            f"\nTRL's step {trl:.2f} s: rlhfkit is {trl / step:.2f}x. {args.speed_up}x would be a step of {need:.2f} s, "
            f"{need / total:.2f}x the matmul floor (rlhfkit's step now: {step / total:.2f}x); a step at the floor "
            f"would be {trl / total:.2f}x TRL's."
        )
    print(summary(run.get("stamp")))


if __name__ == "__main__":
    main()
