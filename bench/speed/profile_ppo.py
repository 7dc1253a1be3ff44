"""Where one rlhfkit PPO step's time goes, next to the matmul-FLOP floor of that step on this machine.

    python -m bench profile_ppo [--size tiny|small|smollm2] [--steps 6] [--threads 0] [--lora-r 0] [--out FILE.json]

Runs `rlhfkit ppo` with the settings of the PPO comparison (the models of bench/vs_trl/ppo_vs_trl.py, built and
cached on first use; `--size smollm2`: SmolLM2-135M-Instruct with bench/vs_trl/real_model.py's PPO settings) and
reads each step's phases from the trainer's own timing metrics in the run's metrics.jsonl:

  generate     time/generate_s                                  step 1: sampling the responses
  score        time/score_s                                     step 2: the reward
  forward      time/forward_s                                   steps 3-4: log-probs (policy, reference), values
  advantages   time/rollout_s less the three above              steps 5-6: KL-penalised rewards, advantages
  update       time/update_s                                    step 7: the PPO epochs
  rest         time/step_s less time/rollout_s and time/update_s    step 8: metrics, the KL controller

Each is the median over steps 2..N (the first is a warm-up). The floor (bench/speed/flops.py) divides each phase's
matmul FLOPs, counted over real tokens (the mean prompt and the mean response of the run), by the matmul rate
measured here at the model's shapes: decode rows for generation, the batch's tokens for the rest.
With --out the run is merged into that JSON file under its machine and run key (bench/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench import results_file
from bench.harness import models as bench_models
from bench.harness.runs import BENCH, check, log, rlhfkit_cmd, run_measured
from bench.speed.flops import measure_matmul_rate, model_shapes, step_flops
from bench.stamp import Stamp, summary

PHASES = ("generate", "score", "forward", "advantages", "update", "rest")
# the floor's phases (bench/speed/flops.py step_flops) that make up each measured phase
FLOOR_OF = {
    "generate": ("generate",),
    "score": ("score",),
    "forward": ("rollout forwards", "reference forward"),
    "update": ("update",),
}


def phases(row: dict) -> dict[str, float]:
    """One logged step's seconds by phase, from the trainer's time/* metrics."""
    rollout, update, step = row["time/rollout_s"], row["time/update_s"], row["time/step_s"]
    got = {k: row[f"time/{k}_s"] for k in ("generate", "score", "forward")}
    return {**got, "advantages": rollout - sum(got.values()), "update": update, "rest": step - rollout - update}


def prompt_tokens(model: str, prompts_file: Path, limit: int = 128) -> float:
    """The mean token count of the training prompts under the model's tokenizer (cut at ``limit``)."""
    from rlhfkit.data.encode import encode_prompt
    from rlhfkit.data.schema import load_examples
    from rlhfkit.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    prompts = [ex.prompt for ex in load_examples(str(prompts_file), "prompt", "bench")]
    return statistics.mean(len(encode_prompt(tokenizer, p, limit)) for p in prompts)


def print_table(run: dict) -> None:
    med, floor = run["median_s"], run.get("floor_s", {})
    print(
        f"\nrlhfkit PPO step, {run['size']}, {'LoRA r=%d' % run['lora_r'] if run['lora_r'] else 'full'}, "
        f"threads {run['threads']}: median over steps 2..N"
    )
    print(f"{'phase':<22} {'seconds':>9} {'share':>7} {'floor s':>9} {'x floor':>8}")
    for name, seconds in med.items():
        f = floor.get(name)
        cells = f"{f:>9.4f} {seconds / f:>8.1f}" if f else f"{'':>9} {'':>8}"
        print(f"{name:<22} {seconds:>9.4f} {seconds / run['step_s']:>7.1%} {cells}")
    print(f"{'step':<22} {run['step_s']:>9.4f} {'':>7}   {run['tokens_per_s']:.0f} generated tokens/s")
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=[*bench_models.PREP, "smollm2"], help="the model")
    ap.add_argument("--steps", type=int, default=6, help="PPO steps; the first (warm-up) is left out")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's default")
    ap.add_argument("--lora-r", type=int, default=0, help="the one-backbone LoRA mode instead")
    ap.add_argument("--learning-rate", type=float, default=None)
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work"))
    ap.add_argument("--out", default=None, help="JSON file the run is merged into (under its machine and run key)")
    ap.add_argument("--quick", action="store_true", help="models trained a few steps only (kept apart): a wiring check")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:
        return
    if args.steps < 2:
        ap.error("--steps must be at least 2")
    stamp = Stamp()
    work, data, _ = bench_models.prepare(args.threads, args.work_dir, None)
    if args.size == "smollm2":
        models, settings = bench_models.smollm2_models(work, log), bench_models.SMOLLM2_PPO
        lr = args.learning_rate or bench_models.SMOLLM2_LR["lora" if args.lora_r else "full"]
    else:
        models = bench_models.build_models(args.size, work, data, log, args.quick)
        settings = bench_models.SETTINGS
        lr = args.learning_rate or (bench_models.DEFAULT_LORA_LR if args.lora_r else bench_models.DEFAULT_LR)[args.size]
    out = work / args.size / "profile"
    flags = bench_models.rlhfkit_ppo_flags(models, data, out, args.steps, lr, 0, args.lora_r, settings=settings)
    log(f"[{args.size}] rlhfkit ppo, {args.steps} steps")
    check(run_measured(rlhfkit_cmd("ppo", *flags, "--overwrite-output-dir", "true"), out.with_suffix(".log")), "ppo")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "time/step_s" in r][1:]  # the first step is a warm-up
    per_step = [phases(r) for r in steps]
    med = {k: statistics.median(p[k] for p in per_step) for k in PHASES}
    step_s = statistics.median(r["time/step_s"] for r in steps)
    B, E = settings["batch_size"], settings["ppo_epochs"]
    response = statistics.mean(r["response/length"] for r in steps)
    prompt = prompt_tokens(models["sft"], data["prompts_train"])
    shapes = model_shapes(models["sft"])
    flops = step_flops(
        shapes,
        B,
        round(prompt),
        max(1, round(response)),
        E,
        separate_value=not args.lora_r,
        lora=bool(args.lora_r),
        real=(B * prompt, B * response),
    )
    rate_full = measure_matmul_rate(shapes, round(B * (prompt + response)))
    rate_decode = measure_matmul_rate(shapes, B)
    floor_parts = {k: v / ((rate_decode if k == "generate" else rate_full) * 1e9) for k, v in flops.items()}
    floor = {name: sum(floor_parts[p] for p in parts) for name, parts in FLOOR_OF.items()}
    record = stamp.record()
    run = {
        "stamp": record,
        "args": vars(args),
        "size": args.size,
        "lora_r": args.lora_r,
        "threads": torch.get_num_threads(),
        "median_s": med,
        "step_s": step_s,
        "tokens_per_s": B * response / step_s,
        "flops": flops,
        "matmul_gflops": {"full": rate_full, "decode": rate_decode},
        "floor_s": floor,
        "steps": per_step,
        "shapes": shapes,
    }
    print_table(run)
    if args.out:
        key = results_file.run_key(record["commit"], vars(args), vars(ap.parse_args([])))
        results_file.merge(Path(args.out), "profile_ppo", results_file.machine_key(record), key, run)


if __name__ == "__main__":
    main()
