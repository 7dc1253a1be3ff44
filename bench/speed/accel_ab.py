"""What each piece of the performance code buys on a real model, SmolLM2-135M-Instruct: every piece that
applies to a row is left off in turn (``RLHFKIT_ACCEL_SKIP``, see ``rlhfkit.accel.PIECES``), and the opt-in
compiled decode step turned on, against the same run with everything on, in one session.

    python -m bench accel_ab [--rounds 2] [--steps 3] [--rows grpo,ppo,...] [--pieces NAME,...] [--out FILE.json]
    python -m bench accel_ab --report bench/reported/accel_ab.json [--run TEXT]

Rows: real_model.py's online rows (GRPO and PPO, full fine-tuning and LoRA r=16; 16 completions of 32 new tokens,
fp32, the same settings, models and seed). Each round runs, per row, the variants with a baseline run before every
--base-every of them, every run in its own subprocess started when the machine is quiet; a second round runs them
in the reverse order, so a drift of the machine over the session does not favour one side. Seconds per step: the median of steps 2..N
(harness.runs.step_stats); peak memory: the run's peak RSS. A variant's effect is its change against the baseline's
runs of the same row (the mean over rounds): positive means the piece helps (the run without it is slower or
larger).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench import results_file
from bench.harness.models import prepare, smollm2_models
from bench.harness.runs import BENCH, Results, log, step_stats
from bench.stamp import Stamp, summary
from bench.vs_trl import grpo_vs_trl, ppo_vs_trl, real_model

ROWS = {"grpo": ("grpo", "full"), "ppo": ("ppo", "full"), "grpo-lora": ("grpo", "lora"), "ppo-lora": ("ppo", "lora")}
EVERY_ROW = ("swiglu_mlp", "onednn_linears", "packing", "lean_decode", "vocab_blocks", "kept_heap")
COMPILE = "compile_decode"  # the opt-in --compile-decode true, against its default (off)


def variants(row: str) -> list[str]:
    """The pieces that apply to ``row`` (SmolLM2 is a Llama: no GELU, so ``fused_gelu`` applies to no row)."""
    command, mode = ROWS[row]
    out = list(EVERY_ROW)
    if mode == "lora":
        out.append("fused_lora")
    if command == "ppo" and mode == "full":
        out.append("value_pass_apart")  # a separate value model
    return out + [COMPILE]


def run(row: str, variant: str, models, data, work: Path, steps: int, seed: int) -> dict:
    command, mode = ROWS[row]
    env = {k: v for k, v in os.environ.items() if k not in ("RLHFKIT_ACCEL", "RLHFKIT_ACCEL_SKIP")}
    if variant and variant != COMPILE:
        env["RLHFKIT_ACCEL_SKIP"] = variant
    out = work / "smollm2" / "ab" / f"{row}-{variant or 'base'}"
    lr = real_model.LR[mode]
    if command == "grpo":
        flags = ["--lora-r", str(real_model.LORA_R)] if mode == "lora" else []
        r = grpo_vs_trl.run_rlhfkit(models, data, out, steps, lr, seed, env, variant == COMPILE, real_model.GRPO, flags)
    else:
        lora_r = real_model.LORA_R if mode == "lora" else 0
        extra = ["--compile-decode", "true"] if variant == COMPILE else []
        r = ppo_vs_trl.run_rlhfkit(models, data, out, steps, lr, seed, lora_r, False, real_model.PPO, extra, env)
    r.update(step_stats(r))
    return {k: r[k] for k in ("step_s", "step_s_all", "first_step_s", "peak_rss_mb", "generated_tokens")}


def effects(results: dict) -> list[dict]:
    """Per row and variant: the mean step time and peak RSS of its runs against the baseline's."""
    out = []
    for row, by_variant in results["rows"].items():
        base = by_variant.get("base", [])
        if not base:
            continue
        b_step = statistics.mean(r["step_s"] for r in base)
        b_rss = statistics.mean(r["peak_rss_mb"] for r in base)
        for variant, runs in by_variant.items():
            if variant == "base":
                continue
            step = statistics.mean(r["step_s"] for r in runs)
            rss = statistics.mean(r["peak_rss_mb"] for r in runs)
            out.append(
                dict(
                    row=row,
                    variant=variant,
                    runs=len(runs),
                    base_runs=len(base),
                    step_s=step,
                    base_step_s=b_step,
                    step_gain=(step - b_step) / b_step,
                    rss_mb=rss,
                    base_rss_mb=b_rss,
                    rss_gain=(rss - b_rss) / b_rss,
                )
            )
    return out


def print_table(results: dict) -> None:
    header = f"{'variant':<24} {'row':<10} {'runs':>4} {'s/step':>7} {'base':>7} {'Δ step':>8} {'RSS MB':>7} {'base':>7} {'Δ RSS':>7}"
    print("\n" + header + "\n" + "-" * len(header))
    for e in sorted(effects(results), key=lambda e: (e["variant"], e["row"])):
        print(
            f"{e['variant']:<24} {e['row']:<10} {e['runs']:>4} {e['step_s']:>7.2f} {e['base_step_s']:>7.2f} "
            f"{e['step_gain']:>+8.1%} {e['rss_mb']:>7.0f} {e['base_rss_mb']:>7.0f} {e['rss_gain']:>+7.1%}"
        )
    print("\nΔ: the run with the piece left off (compile_decode: turned on) against the baseline; + = slower / larger")
    print(summary(results.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds, alternately in forward and reverse order")
    ap.add_argument("--steps", type=int, default=3, help="steps of each run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows")
    ap.add_argument("--pieces", default="", help="comma-separated variants to run (default: all that apply)")
    ap.add_argument("--base-every", type=int, default=3, help="a baseline run before every this many variants")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in every run (OMP_NUM_THREADS)")
    ap.add_argument("--max-load", type=float, default=0.7, help="start a run when fewer cores are busy (over 5 s)")
    ap.add_argument("--max-wait", type=float, default=30, help="seconds to wait for that before running anyway")
    ap.add_argument("--out", default=str(BENCH / "results" / "accel_ab.json"), help="the benchmark's JSON file")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work"), help="models and run outputs")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:  # --report: printed
        return
    rows = real_model.wanted_rows(ap, args.rows, [(name,) for name in ROWS]) or list(ROWS)
    pieces = [x.strip() for x in args.pieces.split(",") if x.strip()]
    stamp = Stamp()
    work, data, _ = prepare(args.threads, args.work_dir, None)
    models = smollm2_models(work, log)
    results = Results(
        Path(args.out),
        stamp,
        "accel_ab",
        vars(ap.parse_args([])),
        args=vars(args),
        settings={"grpo": real_model.GRPO, "ppo": real_model.PPO, "lr": real_model.LR, "lora_r": real_model.LORA_R},
        models=models,
        rows={},
    )
    for k in range(args.rounds):
        plan = []
        for row in rows:
            chosen = [v for v in variants(row) if not pieces or v in pieces]
            for i, variant in enumerate(chosen):
                if i % args.base_every == 0:
                    plan.append((row, ""))
                plan.append((row, variant))
        for row, variant in plan if k % 2 == 0 else reversed(plan):
            gate = grpo_vs_trl.machine_quiet(args.max_load, args.max_wait, log)
            r = run(row, variant, models, data, work, args.steps, args.seed)
            r.update(round=k, machine_before=gate)
            results["rows"].setdefault(row, {}).setdefault(variant or "base", []).append(r)
            log(f"round {k} {row} {variant or 'base'}: {r['step_s']:.2f} s/step, peak RSS {r['peak_rss_mb']:.0f} MB")
            results.save()
    results.close()
    print_table(results)
    print(f"\nwrote {results.where()}")


if __name__ == "__main__":
    main()
