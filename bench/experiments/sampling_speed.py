"""Time `rlhfkit.models.sampling.sample_responses` alone, the rollout's generation step, at the benchmark sizes.

    python bench/experiments/sampling_speed.py [--sizes tiny,small] [--layouts grpo,ppo] [--calls 8] [--threads 2]
    python bench/experiments/sampling_speed.py --against DIR [--rounds 5]      # A/B: DIR's rlhfkit against this one

Models: `rlhfkit init-model` (random weights, GPT-2) per size, on the support task's corpus, made once in
--work-dir; or --model DIR for one given model (an SFT policy stops early, a random one runs to the limit).
Prompts are the support task's training prompts, tokenized as they are. Layouts:

  grpo   --prompts prompts, each repeated --group times, a group's rows contiguous (GRPO's batch; the
         default 4 x 8 = 32 rows is bench/vs_trl/grpo_vs_trl.py's setting)
  ppo    --batch distinct prompts, one row each (PPO's batch: 16 rows, bench/vs_trl/ppo_vs_trl.py's setting)

Each timed call samples --max-new-tokens tokens for the whole batch, seeded; a table gives the median call time,
the median CPU time of this process per call (the work done: with --threads 1 less sensitive to other load
than the wall time), the median time per decode step (call time / longest response), and the load average.

With --against DIR (a checkout of another commit, e.g. made with `git worktree add ../base main`), each round
runs this script's measurement once in a subprocess importing DIR's rlhfkit and once importing this checkout's,
in alternating order, and the table gives the median over rounds of each side and their ratio. The machine may be
shared: the 1-minute load average is printed with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent


def build_model(size: str, work: Path) -> Path:
    """A random-weight GPT-2 of ``size`` with a BPE tokenizer trained on the support task's corpus (made once)."""
    out = work / f"init-{size}"
    if not (out / "config.json").exists():
        from rlhfkit.config.commands import InitModelConfig
        from rlhfkit.models.init_model import init_model

        init_model(
            InitModelConfig(output_dir=str(out), corpus=str(prompts_file(work).parent / "corpus.txt"), size=size)
        )
    return out


def prompts_file(work: Path) -> Path:
    data = work / "data"
    if not (data / "corpus.txt").exists():
        from rlhfkit.tasks.support import write_task_data

        write_task_data(data, seed=0)
    return data / "prompts_train.jsonl"


def layout_prompts(layout: str, texts: list[str], args) -> list[str]:
    if layout == "grpo":
        return [t for t in texts[: args.prompts] for _ in range(args.group)]
    if layout == "ppo":
        return texts[: args.batch]
    raise SystemExit(f"unknown layout {layout!r} (grpo, ppo)")


def measure(args) -> list[dict]:
    """``_measure`` as a command samples: under ``--accel auto`` (``rlhfkit.accel.switched``)."""
    from rlhfkit import accel

    with accel.switched("auto"):
        return _measure(args)


def _measure(args) -> list[dict]:
    """This process's measurement: per size and layout, ``--calls`` seeded calls after ``--warmup`` ones."""
    import torch

    import rlhfkit
    from rlhfkit.config.parts import GenerationArgs
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer
    from rlhfkit.models.sampling import sample_responses

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    texts = [json.loads(line)["prompt"] for line in prompts_file(work).read_text().splitlines() if line.strip()]
    gen = GenerationArgs(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    rows = []
    models = [("model", Path(args.model))] if args.model else [(s, build_model(s, work)) for s in args.sizes]
    for size, path in models:
        tok = load_tokenizer(str(path))
        model = load_causal_lm(str(path), tokenizer=tok)
        for layout in args.layouts:
            prompts = [tok(t)["input_ids"] for t in layout_prompts(layout, texts, args)]
            times, cpu, steps = [], [], []
            load = os.getloadavg()[0]
            for call in range(args.warmup + args.calls):
                torch.manual_seed(call)
                start, start_cpu = time.perf_counter(), time.process_time()
                out = sample_responses(model, tok, prompts, gen, len(prompts), "cpu")
                elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
                if call >= args.warmup:
                    times.append(elapsed)
                    cpu.append(elapsed_cpu)
                    steps.append(max(len(r) for r in out))
            rows.append(
                {
                    "size": size,
                    "layout": layout,
                    "rows": len(prompts),
                    "call_s": statistics.median(times),
                    "cpu_s": statistics.median(cpu),
                    "step_ms": statistics.median(1000 * t / s for t, s in zip(times, steps)),
                    "load_1min": round((load + os.getloadavg()[0]) / 2, 2),
                    "rlhfkit": str(Path(rlhfkit.__file__).parent.parent),
                }
            )
    return rows


def child_cmd(args, source: Path) -> tuple[list[str], dict]:
    cmd = [sys.executable, __file__, "--child", "--work-dir", args.work_dir, "--threads", str(args.threads)]
    cmd += ["--sizes", ",".join(args.sizes), "--layouts", ",".join(args.layouts), "--calls", str(args.calls)]
    cmd += ["--warmup", str(args.warmup), "--max-new-tokens", str(args.max_new_tokens)]
    cmd += ["--prompts", str(args.prompts), "--group", str(args.group), "--batch", str(args.batch)]
    cmd += ["--temperature", str(args.temperature)] + (["--model", args.model] if args.model else [])
    threads = str(args.threads)
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return cmd, env


def compare(args) -> None:
    sides = {"A": Path(args.against).resolve(), "B": ROOT}
    results: dict[str, list[list[dict]]] = {"A": [], "B": []}
    if not args.model:
        for size in args.sizes:
            build_model(size, Path(args.work_dir))  # once, before any timing
    for r in range(args.rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            cmd, env = child_cmd(args, sides[side])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                raise SystemExit(f"side {side} failed:\n{proc.stderr[-3000:]}")
            rows = json.loads(proc.stdout.strip().splitlines()[-1])
            results[side].append(rows)
            print(f"round {r + 1} {side}: " + ", ".join(f"{x['size']}/{x['layout']} {x['call_s']:.4f}s" for x in rows))
    print(f"\nA = {sides['A']}  (rlhfkit from {results['A'][0][0]['rlhfkit']})")
    print(f"B = {sides['B']}  (rlhfkit from {results['B'][0][0]['rlhfkit']})")
    print(
        f"median over {args.rounds} interleaved rounds, each the median of {args.calls} calls; threads {args.threads}"
    )
    print(
        f"{'size':6} {'layout':6} {'rows':>4} {'A s/call':>9} {'B s/call':>9} {'A/B':>6} {'A cpu s':>8} {'B cpu s':>8} "
        f"{'A/B cpu':>7} {'A ms/tok':>9} {'B ms/tok':>9} {'load 1min':>12}"
    )
    for i, row in enumerate(results["A"][0]):
        a = [rows[i] for rows in results["A"]]
        b = [rows[i] for rows in results["B"]]
        a_s, b_s = median_of(a, "call_s"), median_of(b, "call_s")
        a_cpu, b_cpu = median_of(a, "cpu_s"), median_of(b, "cpu_s")
        loads = [x["load_1min"] for x in a + b]
        print(
            f"{row['size']:6} {row['layout']:6} {row['rows']:>4} {a_s:9.4f} {b_s:9.4f} {a_s / b_s:6.2f} "
            f"{a_cpu:8.4f} {b_cpu:8.4f} {a_cpu / b_cpu:7.2f} {median_of(a, 'step_ms'):9.2f} "
            f"{median_of(b, 'step_ms'):9.2f} {min(loads):5.2f}..{max(loads):<5.2f}"
        )


def median_of(rows: list[dict], key: str) -> float:
    return statistics.median(x[key] for x in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="tiny,small", help="init-model sizes, comma-separated")
    ap.add_argument("--model", default="", help="time this model directory instead of the --sizes models")
    ap.add_argument("--layouts", default="grpo,ppo", help="grpo (--prompts x --group rows), ppo (--batch rows)")
    ap.add_argument("--prompts", type=int, default=4, help="distinct prompts of the grpo layout")
    ap.add_argument("--group", type=int, default=8, help="G: rows per prompt of the grpo layout")
    ap.add_argument("--batch", type=int, default=16, help="rows of the ppo layout")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--calls", type=int, default=8, help="timed calls per size and layout (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "sampling-work"), help="models and data (reused)")
    ap.add_argument("--against", default="", help="A/B: a source tree whose rlhfkit/ is compared with this one")
    ap.add_argument("--rounds", type=int, default=5, help="A/B rounds (alternating order)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.layouts = [s for s in args.layouts.split(",") if s]
    if args.child:
        print(json.dumps(measure(args)))
    elif args.against:
        compare(args)
    else:
        rows = measure(args)
        print(
            f"sample_responses, {args.max_new_tokens} new tokens, threads {args.threads}, median of {args.calls} calls"
        )
        print(f"{'size':6} {'layout':6} {'rows':>4} {'s/call':>8} {'cpu s':>8} {'ms/step':>8} {'load 1min':>9}")
        for x in rows:
            print(
                f"{x['size']:6} {x['layout']:6} {x['rows']:>4} {x['call_s']:8.4f} {x['cpu_s']:8.4f} "
                f"{x['step_ms']:8.2f} {x['load_1min']:9.2f}"
            )


if __name__ == "__main__":
    main()
