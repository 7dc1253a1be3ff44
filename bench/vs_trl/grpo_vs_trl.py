"""rlhfkit GRPO vs Hugging Face TRL 1.16's GRPOTrainer on this machine: step time, peak RSS, learning.

    python -m bench grpo_vs_trl [--sizes tiny,small] [--steps 20] [--repeats 3] [--seeds 10] [--out FILE.json]
    python -m bench grpo_vs_trl --report bench/reported/grpo_vs_trl.json [--run TEXT]

What it does, per model size:
  1. models (bench/harness/models.py; cached in --work-dir): `rlhfkit init-model` on the support task's corpus ->
     short `rlhfkit sft`. Both frameworks start from this SFT policy (the reward model harness/models.py also makes
     is not used here).
  2. per seed, each in its own subprocess, one after the other: `rlhfkit grpo` (bench/harness/rlhfkit_runner.py, this
     venv) and TRL's GRPOTrainer (bench/vs_trl/trl_grpo_runner.py in bench/.venv-trl-grpo), with the same reward
     function (bench/harness/grpo_reward.py: the support task's gold judge, deterministic), prompts and settings.
     Before each run the benchmark waits until the machine is quiet (see --max-load).
  3. learning, two ways: the training reward gain (mean reward of the last --gain-window steps minus the first,
     from each framework's logged metrics), and the held-out gain: fresh samples for the held-out prompts from
     the SFT policy and from each final policy, one decoding for all (bench/harness/gold_eval.py), scored by the same
     reward function.

Speed: seconds per step = median over steps 2..N of the time between consecutive step ends (the start-up and
the first, warm-up step are excluded); peak RSS = ru_maxrss of the subprocess (os.wait4). --repeats seeds per
size (seed, seed+1, ...); --seeds N runs N seeds at --learning-size instead, for the learning comparison
(mean ± standard error over seeds). The result carries a "stamp" (bench/stamp.py) and, per run, the machine's
load before it and the cores other work kept busy during it; it is merged into --out after every run, under its
machine and run key (bench/results_file.py), beside the other runs the file holds.

One difference is TRL's and is left as it is: its training forwards (``_get_per_token_logps_and_entropies``)
pass no position ids, so on the benchmark's GPT-2 models (learned absolute positions) a left-padded row is
scored at positions shifted by its pad count, unlike how it was sampled (generate derives them from the mask)
and how rlhfkit scores it. The log-probs of such rows differ by up to several nats from the sampling policy's,
and so do the gradients (models with rotary positions are unaffected). It bears on the learning columns.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

from bench import results_file
from bench.harness.models import PREP, TRL_GRPO_PYTHON, build_models, prepare
from bench.harness.runs import (
    BENCH,
    PYTHON,
    Results,
    busy_cores,
    check,
    log,
    measured,
    rss_comparable,
    run_measured,
    step_stats,
)
from bench.stamp import Stamp, load_average, summary
from bench.stats import diff_se, mean_se, mean_std, pm

# The shared GRPO settings; TRL's names are in trl_grpo_runner.py, rlhfkit's flags in rlhfkit_grpo_flags.
SETTINGS = dict(
    batch_size=32,  # completions per step (rlhfkit --batch-size, TRL per_device_train_batch_size)
    num_generations=8,  # G: completions per prompt, so 4 prompts per step
    max_new_tokens=32,
    temperature=1.0,
    kl_coef=0.04,  # beta of the k3 KL in the loss
    clip_eps=0.2,
    ppo_epochs=1,  # one update per batch (TRL num_iterations)
    loss_aggregation="seq-mean-token-mean",
    scale_rewards="group",
    max_grad_norm=1.0,
)
# rlhfkit --loss-aggregation -> TRL loss_type. "dapo" normalises by the tokens of the generation batch; with
# one process, no accumulation and one step per generation that is the batch's token mean, as "bnpo".
TRL_LOSS_TYPE = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo"}
DEFAULT_LR = {"tiny": 3e-4, "small": 1e-4}  # both frameworks
REWARD_FILE, REWARD_NAME = BENCH / "harness" / "grpo_reward.py", "support_gold"
FRAMEWORKS = ("rlhfkit", "trl")


# ---- runs --------------------------------------------------------------------------------------
def rlhfkit_grpo_flags(
    models: dict, data: dict, out: Path, steps: int, lr: float, seed: int, s: dict, compile_decode: bool = False
) -> list[str]:
    return [
        "--compile-decode",
        str(compile_decode).lower(),
        "--model",
        models["sft"],
        "--reward-fn",
        f"{REWARD_FILE}:{REWARD_NAME}",
        "--data",
        str(data["prompts_train"]),
        "--output-dir",
        str(out),
        "--max-steps",
        str(steps),
        "--seed",
        str(seed),
        "--learning-rate",
        str(lr),
        "--batch-size",
        str(s["batch_size"]),
        "--num-generations",
        str(s["num_generations"]),
        "--max-new-tokens",
        str(s["max_new_tokens"]),
        "--temperature",
        str(s["temperature"]),
        "--top-k",
        "0",
        "--top-p",
        "1.0",
        "--advantage",
        "grpo",
        "--scale-rewards",
        s["scale_rewards"],
        "--kl-coef",
        str(s["kl_coef"]),
        "--kl-in-loss",
        "true",
        "--clip-eps",
        str(s["clip_eps"]),
        "--ppo-epochs",
        str(s["ppo_epochs"]),
        "--num-minibatches",
        "1",
        "--loss-aggregation",
        s["loss_aggregation"],
        "--entropy-coef",
        "0",
        "--mask-truncated-completions",
        "false",
        "--drop-zero-std-groups",
        "false",
        "--reward-clip",
        "none",
        "--missing-eos-penalty",
        "none",
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
        "--sample-steps",
        str(steps),
        "--progress",
        "false",
    ]


def machine_quiet(max_load: float, max_wait_s: float, log) -> dict:
    """Wait until the cores busy over 5 s (everything on the machine; none of the benchmark's runs is going)
    are below ``max_load``, for at most ``max_wait_s``. The 1-minute load average is recorded, not waited on:
    it still counts the previous run for a minute or two."""
    t0 = time.perf_counter()
    while True:
        busy = busy_cores(5.0)
        waited = time.perf_counter() - t0
        if busy is None or busy < max_load or waited >= max_wait_s:
            quiet = busy is None or busy < max_load
            if not quiet:
                log(f"machine still busy ({busy} cores) after {waited:.0f} s; running anyway (flagged in the JSON)")
            return {"busy_cores": busy, "load_1min": load_average()[0], "waited_s": round(waited), "quiet": quiet}
        if waited < 6:
            log(f"waiting for a quiet machine: {busy} cores busy (limit {max_load:g})")


def reward_gain(rewards: list[float], k: int) -> float | None:
    """Mean reward of the last ``k`` steps minus that of the first ``k``."""
    rewards = [r for r in rewards if r is not None and math.isfinite(r)]
    if len(rewards) < 2 * k:
        return None
    return statistics.mean(rewards[-k:]) - statistics.mean(rewards[:k])


def run_rlhfkit(
    models, data, out: Path, steps, lr, seed, env, compile_decode: bool = False, settings=None, extra=()
) -> dict:
    """One `rlhfkit grpo` run with ``settings`` (default SETTINGS) and ``extra`` flags after the shared ones."""
    s = settings or SETTINGS
    shutil.rmtree(out, ignore_errors=True)
    result_file = out.parent / f"{out.name}.result.json"
    cmd = [PYTHON, str(BENCH / "harness" / "rlhfkit_runner.py"), str(result_file), "grpo", "--"]
    flags = rlhfkit_grpo_flags(models, data, out, steps, lr, seed, s, compile_decode) + list(extra)
    m, others = measured(cmd + flags, out.parent / f"{out.name}.log", env)
    check(m, f"rlhfkit grpo ({out})")
    result = json.loads(result_file.read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "reward/score" in r]
    phases = ("time/generate_s", "time/score_s", "time/forward_s", "time/update_s", "time/step_s")
    result.update(
        peak_rss_mb=m.peak_rss_mb,
        process_wall_s=m.wall_s,
        process_cpu_s=m.cpu_s,
        others_busy_cores=others,
        policy=str(out),
        rewards=[r["reward/score"] for r in rows],
        phases={k: statistics.median(r[k] for r in rows[1:]) for k in phases if len(rows) > 1},
    )
    # as TRL logs them: the share of groups whose rewards are all equal, and the k3 KL to the reference per
    # completion token (rlhfkit logs the count of such groups, and the KL summed over each completion)
    B, groups = s["batch_size"], s["batch_size"] // s["num_generations"]
    result["zero_std_fraction"] = [r.get("rollout/zero_std_groups", math.nan) / groups for r in rows]
    result["kl_per_token"] = [
        r["kl/ref_k3"] * B / max(tokens, 1) if "kl/ref_k3" in r else None
        for r, tokens in zip(rows, result["generated_tokens"])
    ]
    return result


def prompts_and_ids(model_dir: str, path: Path) -> tuple[list[str], list[list[int]]]:
    """The prompts and the token ids `rlhfkit grpo` encodes them to (TRL's runner checks it gets the same)."""
    from rlhfkit.data.encode import encode_prompt
    from rlhfkit.data.schema import load_examples
    from rlhfkit.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    prompts = [ex.prompt for ex in load_examples(str(path), "prompt", "bench")]
    return prompts, [encode_prompt(tokenizer, p, 128) for p in prompts]


def trl_phases(steps: list[dict]) -> dict:
    """TRL's own per-step timings (its profiling context), median over steps 2..N, in rlhfkit's phase names
    where they match: generate; score (reward functions); rollout_rest (the rest of the generation batch's
    preparation: reference log-probs, decoding, advantages); loss (the training forward and the loss); and
    backward+optimizer+rest = the step's time between step ends less all of those."""
    names = {
        "generate": "GRPOTrainer.transformers.generate",
        "score": "GRPOTrainer._calculate_rewards",
        "prepare": "GRPOTrainer._prepare_inputs",
        "loss": "GRPOTrainer.compute_loss",
    }
    out = {}
    for key, name in names.items():
        values = [s.get(name, 0.0) for s in steps[1:]]
        if values:
            out[key] = statistics.median(values)
    if "prepare" in out:
        out["rollout_rest"] = out["prepare"] - out.get("generate", 0.0) - out.get("score", 0.0)
    return out


def run_trl(models, data, out: Path, steps, lr, seed, env, settings=None, spec_extra=None) -> dict:
    """One TRL GRPOTrainer run with ``settings`` (default SETTINGS); ``spec_extra`` adds to the runner's spec
    (``lora_r``, ``gradient_checkpointing``, ``save``: see trl_grpo_runner.py)."""
    s = settings or SETTINGS
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    prompts, ids = prompts_and_ids(models["sft"], data["prompts_train"])
    settings = {**s, "learning_rate": lr, "trl_loss_type": TRL_LOSS_TYPE[s["loss_aggregation"]]}
    spec = {
        "policy": models["sft"],
        "train_prompts": prompts,
        "train_ids": ids,
        "reward_file": str(REWARD_FILE),
        "reward_name": REWARD_NAME,
        "settings": settings,
        "steps": steps,
        "seed": seed,
        "output_dir": str(out),
        **(spec_extra or {}),
    }
    (out / "spec.json").write_text(json.dumps(spec))
    cmd = [str(TRL_GRPO_PYTHON), str(BENCH / "vs_trl" / "trl_grpo_runner.py"), str(out / "spec.json")]
    m, others = measured(cmd, out.parent / f"{out.name}.log", env)
    check(m, f"TRL grpo ({out})")
    result = json.loads((out / "bench_result.json").read_text())
    log = result.pop("log")
    result.update(
        peak_rss_mb=m.peak_rss_mb,
        process_wall_s=m.wall_s,
        process_cpu_s=m.cpu_s,
        others_busy_cores=others,
        rewards=[r.get("reward") for r in log],
        kl_per_token=[r.get("kl") for r in log],
        zero_std_fraction=[r.get("frac_reward_zero_std") for r in log],
        trl_log=log,
    )
    result["phases"] = trl_phases(result.pop("phases"))
    return result


def heldout_gold(policy_dir: str, prompts: list[str], samples: int) -> float:
    """Mean reward of fresh samples (gold_eval's one decoding for every policy) on the held-out prompts."""
    from bench.harness.gold_eval import sample_responses
    from bench.harness.grpo_reward import support_gold

    texts, _ = sample_responses(policy_dir, prompts, samples)
    return statistics.mean(support_gold([p for p in prompts for _ in range(samples)], texts))


def import_rss(env: dict) -> dict:
    """Peak RSS of importing each framework's GRPO stack (no model), and of ``import torch`` alone in each
    environment (see harness.runs.rss_comparable)."""
    out = {}
    for name, python, code in [
        ("rlhfkit", PYTHON, "import rlhfkit.cli.main, rlhfkit.trainers.online"),
        ("trl", str(TRL_GRPO_PYTHON), "from trl import GRPOConfig, GRPOTrainer"),
        ("torch_rlhfkit", PYTHON, "import torch"),
        ("torch_trl", str(TRL_GRPO_PYTHON), "import torch"),
    ]:
        m = run_measured([python, "-c", code], BENCH / "results" / "logs" / f"grpo_import_{name}.log", env=env)
        out[name] = m.peak_rss_mb if m.returncode == 0 else None
    return out


# ---- report --------------------------------------------------------------------------------------
def summarise(res: dict) -> dict:
    """Per framework: mean ± std of speed and RSS, mean ± s.e. of the gains; and the comparisons."""
    out: dict = {}
    for name, runs in res["runs"].items():
        out[name] = {
            "step_s": mean_std([r["step_s"] for r in runs]),
            "best_step_s": min(r["step_s"] for r in runs) if runs else None,
            "tokens_per_s": mean_std([r["tokens_per_s"] for r in runs]),
            "peak_rss_mb": mean_std([r["peak_rss_mb"] for r in runs]),
            "train_gain": mean_se([r["train_gain"] for r in runs]),
            "heldout_gain": mean_se([r["heldout_gain"] for r in runs]),
            "seeds": len(runs),
        }
    a, b = res["runs"].get("rlhfkit", []), res["runs"].get("trl", [])
    pairs = list(zip(a, b))
    if pairs:
        ratios = [t["step_s"] / r["step_s"] for r, t in pairs]
        out["speed_ratio_trl_over_rlhfkit"] = {
            "per_seed": mean_std(ratios),
            "of_means": out["trl"]["step_s"][0] / out["rlhfkit"]["step_s"][0],
            "of_best": out["trl"]["best_step_s"] / out["rlhfkit"]["best_step_s"],
        }
        out["rss_ratio_trl_over_rlhfkit"] = out["trl"]["peak_rss_mb"][0] / out["rlhfkit"]["peak_rss_mb"][0]
        for gain in ("train_gain", "heldout_gain"):
            # independent samples (the seeds drive different random streams in the two frameworks)
            out[f"{gain}_difference_rlhfkit_minus_trl"] = diff_se([r[gain] for r in a], [r[gain] for r in b])
    return out


def compiled_sizes(arg: str) -> set[str]:
    """The sizes named by --compile-decode (comma-separated; '' for none)."""
    return {x.strip() for x in arg.split(",") if x.strip()}


def print_table(results: dict) -> None:
    k = results["args"]["gain_window"]
    header = (
        f"{'size':<6} {'run':<8} {'seeds':>5} {'s/step':>15} {'best':>6} {'tokens/s':>13} {'peak RSS MB':>13} "
        f"{'train gain':>14} {'held-out gain':>14}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for size, res in results["sizes"].items():
        s = res.get("summary") or summarise(res)
        for name, runs in res["runs"].items():
            if not runs:
                continue
            print(
                f"{size:<6} {name:<8} {len(runs):>5} {pm(mean_std([r['step_s'] for r in runs]), 3):>15} "
                f"{min(r['step_s'] for r in runs):>6.3f} {pm(mean_std([r['tokens_per_s'] for r in runs]), 0):>13} "
                f"{pm(mean_std([r['peak_rss_mb'] for r in runs]), 0):>13} {pm(mean_se([r['train_gain'] for r in runs]), sign='+'):>14} "
                f"{pm(mean_se([r['heldout_gain'] for r in runs]), sign='+'):>14}"
            )
        notes = [
            f"params {res['models']['params'] / 1e6:.2f}M",
            f"lr {res['learning_rate']:g}",
            f"held-out reward of the SFT policy {res['before']:.2f}",
        ]
        if size in compiled_sizes(results["args"].get("compile_decode", "")):
            notes.append("rlhfkit sampled with --compile-decode")
        if "speed_ratio_trl_over_rlhfkit" in s:
            r = s["speed_ratio_trl_over_rlhfkit"]
            notes.append(
                f"speed TRL/rlhfkit {r['per_seed'][0]:.2f} ± {r['per_seed'][1]:.2f} per seed "
                f"(of means {r['of_means']:.2f}, of best {r['of_best']:.2f})"
            )
            notes.append(f"peak RSS TRL/rlhfkit {s['rss_ratio_trl_over_rlhfkit']:.2f}")
            for gain, label in (("train_gain", "train"), ("heldout_gain", "held-out")):
                m, se = s[f"{gain}_difference_rlhfkit_minus_trl"][:2]  # older runs stored the seed count too
                notes.append(f"{label} gain rlhfkit - TRL {m:+.2f} ± {se:.2f}")
        print(f"{'':<6} " + "; ".join(notes))
        phase_line = []
        for name, runs in res["runs"].items():
            keys = sorted({key for r in runs for key in r.get("phases", {})})
            parts = [
                f"{key.removeprefix('time/').removesuffix('_s')} {mean_std([r['phases'].get(key) for r in runs])[0]:.3f}"
                for key in keys
            ]
            if parts:
                phase_line.append(f"{name}: " + ", ".join(parts))
        if phase_line:
            print(f"{'':<6} s per step by phase (median over steps 2..N, mean over seeds): " + " | ".join(phase_line))
    imp = results.get("import_rss_mb", {})
    load = results.get("load_during", {})
    gates = [r["machine_before"] for res in results["sizes"].values() for runs in res["runs"].values() for r in runs]
    others = [
        r["others_busy_cores"] for res in results["sizes"].values() for runs in res["runs"].values() for r in runs
    ]
    others = [o for o in others if o is not None]
    print(
        f"\n± after s/step, tokens/s, RSS: standard deviation over seeds; after the gains: standard error over seeds. "
        f"s/step = median over steps 2..N. train gain = mean reward of the last {k} steps - the first {k} (logged by "
        f"each framework); held-out gain = reward of fresh samples on the held-out prompts, final policy - SFT "
        f"policy. torch threads {results['machine']['threads']}; import-only RSS: rlhfkit "
        f"{imp.get('rlhfkit') or float('nan'):.0f} MB, TRL {imp.get('trl') or float('nan'):.0f} MB (torch alone "
        f"{imp.get('torch_rlhfkit') or float('nan'):.0f} / {imp.get('torch_trl') or float('nan'):.0f} MB)"
    )
    if gates:
        print(
            f"machine before each run: busy cores max {max(g['busy_cores'] or 0 for g in gates):.2f} (limit "
            f"{results['args']['max_load']:g}), 1-minute load {min(g['load_1min'] for g in gates):.2f}.."
            f"{max(g['load_1min'] for g in gates):.2f}, {sum(not g['quiet'] for g in gates)} run(s) started busy; "
            f"cores other work kept busy during the runs: mean {statistics.mean(others) if others else float('nan'):.2f}, "
            f"max {max(others) if others else float('nan'):.2f}"
        )
    print(
        f"load average (1 min) during the benchmark (its own runs included): mean {load.get('mean')}, min "
        f"{load.get('min')}, max {load.get('max')} on {results['machine']['cpus']} CPUs"
    )
    warning = rss_comparable(imp)
    if warning:
        print(warning)
    print(summary(results.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,small", help="comma-separated: tiny, small")
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps per run (the first is excluded from timings)")
    ap.add_argument("--repeats", type=int, default=3, help="seeds per size (seed, seed+1, ...)")
    ap.add_argument(
        "--seeds", type=int, default=0, help="seeds at --learning-size instead of --repeats (the learning comparison)"
    )
    ap.add_argument("--learning-size", default="tiny", help="the size --seeds applies to")
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--learning-rate", type=float, default=None, help="learning rate for both (default per size)")
    ap.add_argument(
        "--loss-aggregation",
        choices=sorted(TRL_LOSS_TYPE),
        default=SETTINGS["loss_aggregation"],
        help="rlhfkit --loss-aggregation; TRL gets the matching loss_type",
    )
    ap.add_argument("--scale-rewards", choices=["group", "batch", "none"], default=SETTINGS["scale_rewards"])
    ap.add_argument("--kl-coef", type=float, default=SETTINGS["kl_coef"], help="beta for both")
    ap.add_argument("--num-generations", type=int, default=SETTINGS["num_generations"], help="G for both")
    ap.add_argument("--batch-size", type=int, default=SETTINGS["batch_size"], help="completions per step for both")
    ap.add_argument("--gain-window", type=int, default=5, help="k: the train gain is the last k steps - the first k")
    ap.add_argument("--eval-samples", type=int, default=4, help="samples per held-out prompt for the held-out gain")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in every run (OMP_NUM_THREADS)")
    ap.add_argument(
        "--max-load", type=float, default=0.7, help="start a run only when fewer cores than this are busy (over 5 s)"
    )
    ap.add_argument("--max-wait", type=float, default=900, help="seconds to wait for that before running anyway")
    ap.add_argument(
        "--compile-decode",
        default="tiny",
        help="comma-separated sizes whose rlhfkit runs sample with --compile-decode true ('' for none); the "
        "compile happens in the first step, which the timings leave out",
    )
    ap.add_argument("--skip-trl", action="store_true", help="rlhfkit rows only (no TRL environment needed)")
    ap.add_argument("--quick", action="store_true", help="models trained a few steps only (kept apart): a wiring check")
    ap.add_argument(
        "--out",
        default=str(BENCH / "results" / "grpo_vs_trl.json"),
        help="the benchmark's JSON file: this run is merged into it under its machine and run key",
    )
    ap.add_argument(
        "--work-dir", default=str(BENCH / "results" / "work"), help="models and run outputs (models are reused)"
    )
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:  # --report: printed
        return
    stamp = Stamp()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for size in sizes:
        if size not in PREP:
            ap.error(f"unknown size {size!r}; known: {', '.join(PREP)}")
    if args.steps < max(3, 2 * args.gain_window):
        ap.error(f"--steps must be at least 3 and 2 x --gain-window ({2 * args.gain_window})")
    SETTINGS.update(
        loss_aggregation=args.loss_aggregation,
        scale_rewards=args.scale_rewards,
        kl_coef=args.kl_coef,
        num_generations=args.num_generations,
        batch_size=args.batch_size,
    )
    if SETTINGS["batch_size"] % SETTINGS["num_generations"]:
        ap.error("--batch-size must be a multiple of --num-generations")

    work, data, eval_prompts = prepare(args.threads, args.work_dir, None if args.skip_trl else "setup_trl_grpo_env.sh")
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    results = Results(
        Path(args.out),
        stamp,
        "grpo_vs_trl",
        vars(ap.parse_args([])),
        args=vars(args),
        settings=dict(SETTINGS, trl_loss_type=TRL_LOSS_TYPE[SETTINGS["loss_aggregation"]]),
        reward=f"{REWARD_FILE.relative_to(BENCH.parent)}:{REWARD_NAME}",
    )
    results["import_rss_mb"] = import_rss(env) if not args.skip_trl else {}
    warning = rss_comparable(results["import_rss_mb"])
    if warning:
        log(warning)

    compiled = compiled_sizes(args.compile_decode)
    for size in sizes:
        models = build_models(size, work, data, log, args.quick)
        lr = args.learning_rate or DEFAULT_LR[size]
        n_seeds = args.seeds if args.seeds and size == args.learning_size else args.repeats
        before = heldout_gold(models["sft"], eval_prompts, args.eval_samples)
        log(f"[{size}] {models['params'] / 1e6:.2f}M params; lr {lr:g}; {n_seeds} seeds; held-out reward {before:.2f}")
        res = {
            "models": models,
            "learning_rate": lr,
            "before": before,
            "runs": {name: [] for name in FRAMEWORKS if name == "rlhfkit" or not args.skip_trl},
        }
        results["sizes"][size] = res
        runs_dir = work / size / "grpo_runs"
        for k in range(n_seeds):
            seed = args.seed + k
            for name in res["runs"]:
                gate = machine_quiet(args.max_load, args.max_wait, log)
                out = runs_dir / f"{name}-s{seed}"
                if name == "rlhfkit":
                    r = run_rlhfkit(models, data, out, args.steps, lr, seed, env, size in compiled)
                else:
                    r = run_trl(models, data, out, args.steps, lr, seed, env)
                r.update(step_stats(r))
                r.update(
                    seed=seed,
                    machine_before=gate,
                    train_gain=reward_gain(r["rewards"], args.gain_window),
                    heldout=heldout_gold(r["policy"], eval_prompts, args.eval_samples),
                )
                r["heldout_gain"] = r["heldout"] - before
                res["runs"][name].append(r)
                log(
                    f"[{size}] seed {seed} {name}: {r['step_s']:.3f} s/step, peak RSS {r['peak_rss_mb']:.0f} MB, "
                    f"reward {statistics.mean(r['rewards'][: args.gain_window]):.2f} -> "
                    f"{statistics.mean(r['rewards'][-args.gain_window :]):.2f}, held-out {before:.2f} -> "
                    f"{r['heldout']:.2f}; busy before {gate['busy_cores']}, others during {r['others_busy_cores']}"
                )
                results.save()
        res["summary"] = summarise(res)
        results.save()
    results.close()
    print_table(results)
    print(f"\nwrote {results.where()}")


if __name__ == "__main__":
    main()
