"""rlhfkit's --loss-aggregation choices for `rlhfkit grpo` and `rlhfkit rloo`, on the arithmetic task: held-out
accuracy gained over the SFT policy, and the length of the replies.

    python -m bench loss_aggregation [--seeds 0,1,2] [--runs grpo:token-mean,...] [--out FILE.json]
    python -m bench loss_aggregation --report bench/reported/loss_aggregation.json [--run TEXT]

Per seed, one after the other, in this process: the task's data, `rlhfkit init-model` and `rlhfkit sft` as
`rlhfkit demo --task arithmetic` makes them (rlhfkit.demo.arithmetic.SETTINGS), then each run of --runs
(COMMAND:AGGREGATION) from that SFT policy with the demo's GRPO stage settings (600 steps, G = 8, 64 completions
a step, learning rate 5e-4, beta = 0, temperature 1, the exact-answer reward plus 0.1 x the format reward) and
the command's other defaults, with --loss-aggregation AGGREGATION. The SFT policy and each final policy then
sample 4 replies to each held-out problem (temperature 1, the demo's evaluation) and the task's judge scores them
(1 for the exact answer). Recorded per seed: each policy's accuracy, mean reply length in tokens (EOS included),
the gain over SFT, the mean training reply length of the last 50 steps, and seconds. The result carries a stamp
(bench/stamp.py) and is merged into --out after every run (bench/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench import results_file
from bench.harness.runs import BENCH, Results, flags, log
from bench.stamp import Stamp, summary

DEFAULT_RUNS = "grpo:seq-mean-token-mean,grpo:token-mean,rloo:seq-mean-token-mean,rloo:token-mean"
EVAL_SAMPLES_PER_PROMPT = 4
LAST_STEPS = 50


def train_tail(run_dir: Path, key: str) -> float | None:
    """The mean of ``key`` over the last LAST_STEPS logged steps of a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    values = [r[key] for r in rows if r.get(key) is not None][-LAST_STEPS:]
    return statistics.mean(values) if values else None


def evaluate(policy: Path, prompts: list, seed: int) -> dict:
    from rlhfkit.config.parts import GenerationArgs
    from rlhfkit.inference.evaluate import evaluate_policy
    from rlhfkit.tasks import get_judge

    gen = GenerationArgs(max_new_tokens=6, temperature=1.0)
    metrics, _ = evaluate_policy(str(policy), prompts, gen, judge=get_judge("arithmetic"), seed=seed)
    return {"accuracy": metrics["reward/gold"], "reply_tokens": metrics["response/tokens"], "n": int(metrics["n"])}


def one_seed(seed: int, runs: list[tuple[str, str]], work: Path, results: Results, quick: bool = False) -> None:
    from rlhfkit.cli.main import run_command
    from rlhfkit.data.schema import load_examples
    from rlhfkit.demo.arithmetic import QUICK, SETTINGS
    from rlhfkit.tasks.arithmetic import write_task_data

    settings = QUICK if quick else SETTINGS
    out = work / f"seed{seed}"
    data = {k: str(v) for k, v in write_task_data(out / "data", seed=seed).items()}
    common = ["--seed", str(seed), "--progress", "false", "--overwrite-output-dir", "true"]
    start = time.perf_counter()
    run_command("init-model", f"--corpus {data['corpus']} --output-dir {out}/base --seed {seed}".split())
    run_command(
        "sft",
        f"--model {out}/base --data {data['sft']} --eval-data {data['sft_eval']} --output-dir {out}/sft".split()
        + flags(settings["sft"])
        + common,
    )
    samples = 1 if quick else EVAL_SAMPLES_PER_PROMPT
    prompts = [ex.prompt for ex in load_examples(data["prompts_eval"], "prompt", "bench")] * samples
    record = results["seeds"][str(seed)] = {"sft": evaluate(out / "sft", prompts, seed), "runs": {}}
    record["sft"]["seconds"] = time.perf_counter() - start
    log(f"seed {seed} SFT: accuracy {record['sft']['accuracy']:.3f}, {record['sft']['reply_tokens']:.2f} tokens")
    results.save()
    for command, aggregation in runs:
        name = f"{command} {aggregation}"
        run_dir = out / name.replace(" ", "_")
        start = time.perf_counter()
        run_command(
            command,
            f"--model {out}/sft --data {data['prompts_train']} --eval-data {data['prompts_eval']} "
            f"--reward-fn arithmetic:exact_answer --reward-fn arithmetic:format --reward-weights 1,0.1 "
            f"--gold-judge arithmetic --output-dir {run_dir} --loss-aggregation {aggregation}".split()
            + flags(settings["grpo"])
            + common,
        )
        seconds = time.perf_counter() - start
        got = evaluate(run_dir, prompts, seed)
        got.update(
            gain=got["accuracy"] - record["sft"]["accuracy"],
            train_reply_tokens=train_tail(run_dir, "response/length"),
            seconds=seconds,
        )
        record["runs"][name] = got
        log(
            f"seed {seed} {name}: accuracy {got['accuracy']:.3f} (gain {got['gain']:+.3f}), {got['reply_tokens']:.2f} tokens"
        )
        results.save()


def print_table(run: dict) -> None:
    by_name: dict[str, list[dict]] = {}
    for record in run["seeds"].values():
        for name, got in record["runs"].items():
            by_name.setdefault(name, []).append(got)
    sft = [r["sft"] for r in run["seeds"].values()]
    print(f"seeds {', '.join(run['seeds'])}; SFT accuracy {[round(s['accuracy'], 3) for s in sft]}")
    for name, gots in by_name.items():
        gains = ", ".join(f"{g['gain']:+.3f}" for g in gots)
        lengths = ", ".join(f"{g['reply_tokens']:.2f}" for g in gots)
        print(f"{name:28s} gain {gains} (mean {statistics.mean(g['gain'] for g in gots):+.3f}); tokens {lengths}")
    print(summary(run.get("stamp")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, run one after the other")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated COMMAND:AGGREGATION (grpo or rloo)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo's default)")
    ap.add_argument("--quick", action="store_true", help="the arithmetic demo's --quick settings: a wiring check")
    ap.add_argument(
        "--out",
        default=str(BENCH / "results" / "loss_aggregation.json"),
        help="the benchmark's JSON file: this run is merged into it under its machine and run key",
    )
    ap.add_argument("--work-dir", default=str(BENCH / "results" / "work" / "loss_aggregation"), help="run outputs")
    args = results_file.parse_or_report(ap, argv, print_table)
    if args is None:  # --report: printed
        return
    stamp = Stamp()
    runs = [tuple(r.strip().split(":", 1)) for r in args.runs.split(",") if r.strip()]
    for r in runs:
        if len(r) != 2 or r[0] not in ("grpo", "rloo"):
            ap.error(f"--runs: {':'.join(r)!r} is not COMMAND:AGGREGATION with COMMAND grpo or rloo")
    import torch

    torch.set_num_threads(args.threads)
    from rlhfkit.demo.arithmetic import QUICK, SETTINGS

    results = Results(Path(args.out), stamp, "loss_aggregation", vars(ap.parse_args([])), args=vars(args))
    settings = QUICK if args.quick else SETTINGS
    results.update(settings=dict(settings, eval_samples_per_prompt=EVAL_SAMPLES_PER_PROMPT), seeds={})
    for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
        one_seed(seed, runs, Path(args.work_dir), results, args.quick)
    results.close()
    print_table(results)
    print(f"\nresults: {results.where()}")


if __name__ == "__main__":
    main()
