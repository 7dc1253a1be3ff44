"""rlhfkit PPO vs Hugging Face TRL 1.12 PPO on this machine: step time, tokens/s, peak RSS, learning.

    python -m bench ppo_vs_trl [--sizes tiny,small] [--steps 20] [--repeats 3] [--out bench/results/ppo_vs_trl.json]
    python -m bench ppo_vs_trl --report bench/reported/ppo_vs_trl.json [--run TEXT]

What it does, per model size:
  1. models (bench/harness/models.py; cached in --work-dir): `rlhfkit init-model` on the support task's corpus ->
     short `rlhfkit sft` -> `rlhfkit rm` (a plain-transformers reward model if that fails). Both PPOs start
     from this SFT policy and use this reward model, and also this reward model as the initial separate
     value model (TRL's way).
  2. per repeat, each in its own subprocess: `rlhfkit ppo` (bench/harness/rlhfkit_runner.py, this venv), `rlhfkit ppo
     --lora-r 8` (one backbone: value head + adapters-off reference), TRL's PPOTrainer (bench/vs_trl/trl_runner.py in
     bench/.venv-trl), and a few `rlhfkit sft` steps of the same model = one model's training footprint.
  3. learning: fresh samples for the held-out eval prompts from the SFT policy and from each final policy,
     with one decoding (bench/harness/gold_eval.py), scored by the task's hidden gold judge and the RM.

Measures: seconds per PPO step = median over steps 2..N of the wall time between consecutive step ends (the
start-up and the first, warm-up step are excluded); tokens/s = response tokens generated in the step (up to
and including EOS) / that step's time, median; peak RSS = ru_maxrss of the subprocess (os.wait4).
Both frameworks run with identical settings (see SETTINGS): batch 16, 32 new tokens, 4 PPO epochs, 1
minibatch, fp32, no gradient clipping, no reward normalisation (TRL has none), k1 KL in the reward.
The run carries a "stamp" (bench/stamp.py: commit, date, machine, load at the start and at the end), whose
one-line summary is printed under the table. It is merged into --out after every run, under its machine and
run key (bench/results_file.py), beside the other runs the file holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path

from bench import results_file
from bench.harness.gold_eval import evaluate
from bench.harness.models import (
    DEFAULT_LORA_LR,
    DEFAULT_LR,
    PREP,
    SETTINGS,
    TRL_PYTHON,
    build_models,
    prepare,
    rlhfkit_ppo_flags,
)
from bench.harness.runs import (
    BENCH,
    PYTHON,
    Results,
    check,
    log,
    measured,
    rlhfkit_cmd,
    rss_comparable,
    run_measured,
    step_stats,
)
from bench.stamp import Stamp, load_average, summary
from bench.stats import mean_std, pm

SPEED_TARGET = {"tiny": 3.0, "small": 1.5}  # rlhfkit s/step at least this many times faster than TRL
LORA_RSS_TARGET = 1.3  # LoRA PPO peak RSS <= this x one model's SFT footprint


# ---- runs --------------------------------------------------------------------------------------
def run_rlhfkit(
    models, data, out: Path, steps, lr, seed, lora_r=0, bf16=False, settings=None, extra=(), env=None
) -> dict:
    """One `rlhfkit ppo` run with ``settings`` (default harness.models.SETTINGS), ``extra`` flags after the shared ones
    and the environment ``env`` (default this process's)."""
    shutil.rmtree(out, ignore_errors=True)
    result_file = out.parent / f"{out.name}.result.json"
    m, others = measured(
        [
            PYTHON,
            str(BENCH / "harness" / "rlhfkit_runner.py"),
            str(result_file),
            "--",
            *rlhfkit_ppo_flags(models, data, out, steps, lr, seed, lora_r, bf16, settings),
            *extra,
        ],
        out.parent / f"{out.name}.log",
        env=env,
    )
    check(m, f"rlhfkit ppo ({out})")
    result = json.loads(result_file.read_text())
    result.update(peak_rss_mb=m.peak_rss_mb, process_wall_s=m.wall_s, others_busy_cores=others, policy=str(out))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    result["internal"] = {
        k: statistics.median(r[k] for r in rows[1:] if k in r)
        for k in ("time/step_s", "time/generate_s", "time/score_s", "time/forward_s", "time/update_s")
        if len(rows) > 1
    }
    result["reward_score_per_step"] = [r.get("reward/score") for r in rows]
    return result


def prompt_ids(model_dir: str, path: Path) -> list[list[int]]:
    """Prompts encoded exactly as `rlhfkit ppo` encodes them (so TRL gets the same token ids)."""
    from rlhfkit.data.encode import encode_prompt
    from rlhfkit.data.schema import load_examples
    from rlhfkit.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    return [encode_prompt(tokenizer, ex.prompt, 128) for ex in load_examples(str(path), "prompt", "bench")]


def run_trl(
    models, data, out: Path, steps, lr, seed, gradient_checkpointing=False, bf16=False, settings=None, spec_extra=None
) -> dict:
    """One TRL PPOTrainer run with ``settings`` (default harness.models.SETTINGS); ``spec_extra`` adds to the runner's
    spec (``lora_r``, ``save``: see trl_runner.py)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec = {
        "policy": models["sft"],
        "reward_model": models["rm"],
        "value_model": models["rm"],
        "train_ids": prompt_ids(models["sft"], data["prompts_train"]),
        "eval_ids": prompt_ids(models["sft"], data["prompts_eval"])[: (settings or SETTINGS)["batch_size"]],
        "settings": {**(settings or SETTINGS), "learning_rate": lr},
        "steps": steps,
        "seed": seed,
        "output_dir": str(out),
        "gradient_checkpointing": gradient_checkpointing,
        "bf16": bf16,
        **(spec_extra or {}),
    }
    (out / "spec.json").write_text(json.dumps(spec))
    m, others = measured(
        [str(TRL_PYTHON), str(BENCH / "vs_trl" / "trl_runner.py"), str(out / "spec.json")],
        out.parent / f"{out.name}.log",
    )
    check(m, f"TRL ppo ({out})")
    result = json.loads((out / "bench_result.json").read_text())
    result.update(peak_rss_mb=m.peak_rss_mb, process_wall_s=m.wall_s, others_busy_cores=others)
    result["reward_score_per_step"] = [r.get("objective/scores") for r in result.pop("log") if "objective/scores" in r]
    return result


def run_sft_footprint(models, data, out: Path) -> dict:
    """A few plain `rlhfkit sft` steps of the same model at the same batch size: one model's training footprint."""
    shutil.rmtree(out, ignore_errors=True)
    m = run_measured(
        rlhfkit_cmd(
            "sft",
            "--model",
            models["sft"],
            "--data",
            str(data["sft"]),
            "--output-dir",
            str(out),
            "--max-steps",
            "5",
            "--batch-size",
            str(SETTINGS["batch_size"]),
            "--learning-rate",
            "1e-5",
            "--mixed-precision",
            "no",
            "--progress",
            "false",
        ),
        out.parent / f"{out.name}.log",
    )
    check(m, f"rlhfkit sft ({out})")
    return {"peak_rss_mb": m.peak_rss_mb, "process_wall_s": m.wall_s}


def import_rss() -> dict:
    """Peak RSS of importing each framework's PPO stack, no model: the part of peak RSS that is libraries.

    Also ``import torch`` alone in each environment (``torch_rlhfkit``, ``torch_trl``): the same torch build
    should cost the same there. It does not when one environment's files were just written (e.g. a fresh
    `make install`): the page cache then maps ~47 MB more of libtorch into every process of that environment
    (file-backed RSS, measured here; the anonymous memory is equal), and peak RSS is no longer comparable."""
    out = {}
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    for name, python, code in [
        ("rlhfkit", PYTHON, "import rlhfkit.cli.main, rlhfkit.trainers.online"),
        ("trl", str(TRL_PYTHON), "from trl.experimental.ppo import PPOTrainer"),
        ("torch_rlhfkit", PYTHON, "import torch"),
        ("torch_trl", str(TRL_PYTHON), "import torch"),
    ]:
        m = run_measured([python, "-c", code], BENCH / "results" / "logs" / f"import_{name}.log", env=env)
        out[name] = m.peak_rss_mb if m.returncode == 0 else None
    return out


# ---- report --------------------------------------------------------------------------------------
def summarise(size_result: dict) -> dict:
    summary = {}
    for name, runs in size_result["runs"].items():
        summary[name] = {
            "step_s": mean_std([r["step_s"] for r in runs]),
            "tokens_per_s": mean_std([r["tokens_per_s"] for r in runs]),
            "peak_rss_mb": mean_std([r["peak_rss_mb"] for r in runs]),
            "gold_gain": mean_std([r["eval"]["gold"] - size_result["before"]["gold"] for r in runs if "eval" in r]),
            "rm_gain": mean_std(
                [r["eval"]["rm_score"] - size_result["before"]["rm_score"] for r in runs if "eval" in r]
            ),
        }
    return summary


def print_table(results: dict) -> None:
    header = (
        f"{'size':<6} {'run':<22} {'s/step':>15} {'best':>6} {'tokens/s':>15} {'peak RSS MB':>15} {'gold gain':>15} "
        f"{'RM gain':>15}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for size, res in results["sizes"].items():
        for name, runs in res["runs"].items():
            before = res["before"]
            gold = [r["eval"]["gold"] - before["gold"] for r in runs if "eval" in r]
            rmg = [r["eval"]["rm_score"] - before["rm_score"] for r in runs if "eval" in r]
            print(
                f"{size:<6} {name:<22} {pm(mean_std([r['step_s'] for r in runs])):>15} {min(r['step_s'] for r in runs):>6.2f} "
                f"{pm(mean_std([r['tokens_per_s'] for r in runs]), 0):>15} "
                f"{pm(mean_std([r['peak_rss_mb'] for r in runs]), 0):>15} {pm(mean_std(gold)):>15} {pm(mean_std(rmg)):>15}"
            )
        sft = res["sft_footprint"]
        print(
            f"{size:<6} {'sft (one model, ref.)':<22} {'':>15} {'':>6} {'':>15} {pm(mean_std([r['peak_rss_mb'] for r in sft]), 0):>15}"
        )
        s = res["summary"]
        notes = [f"params {res['models']['params'] / 1e6:.2f}M", f"gold before {res['before']['gold']:.2f}"]
        if "trl" in s and "rlhfkit" in s:
            best = min(r["step_s"] for r in res["runs"]["trl"]) / min(r["step_s"] for r in res["runs"]["rlhfkit"])
            notes.append(
                f"speed-up vs TRL {s['trl']['step_s'][0] / s['rlhfkit']['step_s'][0]:.2f}x (best repeats {best:.2f}x; "
                f"target >= {SPEED_TARGET.get(size, float('nan')):g}x)"
            )
            notes.append(
                f"RSS rlhfkit/TRL {s['rlhfkit']['peak_rss_mb'][0] / s['trl']['peak_rss_mb'][0]:.2f} (target <= 1)"
            )
        if "rlhfkit-lora" in s:
            sft_rss = mean_std([r["peak_rss_mb"] for r in sft])[0]
            notes.append(
                f"LoRA RSS / SFT RSS {s['rlhfkit-lora']['peak_rss_mb'][0] / sft_rss:.2f} (target <= {LORA_RSS_TARGET:g})"
            )
            if "trl" in s:
                notes.append(f"LoRA speed-up vs TRL {s['trl']['step_s'][0] / s['rlhfkit-lora']['step_s'][0]:.2f}x")
        print(f"{'':<6} " + "; ".join(notes))
    imp = results.get("import_rss_mb", {})
    load = results.get("load_during", {})
    print(
        f"\n± = standard deviation over {results['args']['repeats']} repeat(s); s/step = median over steps 2..N; "
        f"best = fastest repeat (the least disturbed by other load); "
        f"torch threads {results['machine']['threads']}; import-only RSS: rlhfkit {imp.get('rlhfkit') or float('nan'):.0f} MB, "
        f"TRL {imp.get('trl') or float('nan'):.0f} MB (torch alone {imp.get('torch_rlhfkit') or float('nan'):.0f} / "
        f"{imp.get('torch_trl') or float('nan'):.0f} MB)"
    )
    print(
        f"load average (1 min) during the run: mean {load.get('mean')}, min {load.get('min')}, max {load.get('max')} "
        f"on {results['machine']['cpus']} CPUs; before {results['load_before']}, after {results.get('load_after')}"
    )
    warning = rss_comparable(imp)
    if warning:
        print(warning)
    print(summary(results.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,small", help="comma-separated: tiny, small")
    ap.add_argument("--steps", type=int, default=20, help="PPO steps per run (the first is excluded from timings)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each framework per size (mean ± std reported)")
    ap.add_argument(
        "--out",
        default=str(BENCH / "results" / "ppo_vs_trl.json"),
        help="the benchmark's JSON file: this run is merged into it under its machine and run key",
    )
    ap.add_argument(
        "--work-dir", default=str(BENCH / "results" / "work"), help="models and run outputs (models are reused)"
    )
    ap.add_argument("--learning-rate", type=float, default=None, help="PPO learning rate for both (default per size)")
    ap.add_argument("--lora-r", type=int, default=8, help="rank of the rlhfkit LoRA row; 0 skips it")
    ap.add_argument(
        "--lora-learning-rate", type=float, default=None, help="LoRA row's learning rate (default per size)"
    )
    ap.add_argument("--eval-samples", type=int, default=2, help="samples per held-out prompt for the gold/RM gain")
    ap.add_argument("--seed", type=int, default=0, help="repeat k uses seed + k")
    ap.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="keep TRL's default gradient checkpointing (off by default: rlhfkit does not checkpoint)",
    )
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast in both (TRL bf16=True, rlhfkit --mixed-precision bf16); default fp32",
    )
    ap.add_argument("--skip-trl", action="store_true", help="rlhfkit rows only (no TRL environment needed)")
    ap.add_argument("--quick", action="store_true", help="models trained a few steps only (kept apart): a wiring check")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads in every run (OMP_NUM_THREADS); 0 keeps torch's default (one per core)",
    )
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:  # --report: printed
        return
    stamp = Stamp()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for size in sizes:
        if size not in PREP:
            ap.error(f"unknown size {size!r}; known: {', '.join(PREP)}")
    if args.steps < 3:
        ap.error("--steps must be at least 3 (the first step is excluded, and a median needs steps)")

    work, data, eval_prompts = prepare(args.threads, args.work_dir, None if args.skip_trl else "setup_trl_env.sh")
    results = Results(
        Path(args.out),
        stamp,
        "ppo_vs_trl",
        vars(ap.parse_args([])),
        args=vars(args),
        settings=SETTINGS,
    )
    results["import_rss_mb"] = import_rss() if not args.skip_trl else {}
    warning = rss_comparable(results["import_rss_mb"])
    if warning:
        log(warning)

    for size in sizes:
        models = build_models(size, work, data, log, args.quick)
        lr = args.learning_rate or DEFAULT_LR[size]
        lora_lr = args.lora_learning_rate or DEFAULT_LORA_LR[size]
        log(
            f"[{size}] {models['params'] / 1e6:.2f}M params; reward model: {models['made_by']} "
            f"(eval accuracy {models['eval_accuracy']}); PPO lr {lr:g}"
        )
        before = evaluate(models["sft"], models["rm"], eval_prompts, args.eval_samples)
        res = {
            "models": models,
            "learning_rate": lr,
            "lora_learning_rate": lora_lr,
            "before": before,
            "runs": {
                "rlhfkit": [],
                **({"rlhfkit-lora": []} if args.lora_r else {}),
                **({} if args.skip_trl else {"trl": []}),
            },
            "sft_footprint": [],
        }
        results["sizes"][size] = res
        runs_dir = work / size / "runs"
        for k in range(args.repeats):
            seed = args.seed + k
            jobs = [("rlhfkit", lambda o: run_rlhfkit(models, data, o, args.steps, lr, seed, bf16=args.bf16))]
            if args.lora_r:
                jobs.append(
                    (
                        "rlhfkit-lora",
                        lambda o: run_rlhfkit(models, data, o, args.steps, lora_lr, seed, args.lora_r, args.bf16),
                    )
                )
            if not args.skip_trl:
                jobs.append(
                    (
                        "trl",
                        lambda o: run_trl(
                            models, data, o, args.steps, lr, seed, args.trl_gradient_checkpointing, args.bf16
                        ),
                    )
                )
            for name, job in jobs:
                load_start = load_average()[0]
                r = job(runs_dir / f"{name}-r{k}")
                r.update(step_stats(r))
                r["load_1min_start_end"] = [load_start, load_average()[0]]
                r["eval"] = evaluate(r["policy"], models["rm"], eval_prompts, args.eval_samples)
                res["runs"][name].append(r)
                log(
                    f"[{size}] repeat {k + 1}/{args.repeats} {name}: {r['step_s']:.2f} s/step, {r['tokens_per_s']:.0f} tok/s, "
                    f"peak RSS {r['peak_rss_mb']:.0f} MB, gold {before['gold']:.2f} -> {r['eval']['gold']:.2f}, "
                    f"load {r['load_1min_start_end']}"
                )
                results.save()
            res["sft_footprint"].append(run_sft_footprint(models, data, runs_dir / f"sft-footprint-r{k}"))
        res["summary"] = summarise(res)
        results.save()
    results.close()
    print_table(results)
    print(f"\nwrote {results.where()}")


if __name__ == "__main__":
    main()
