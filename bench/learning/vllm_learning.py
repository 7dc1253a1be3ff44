"""Does GRPO learn as much with rollouts from a colocated vLLM engine (--use-vllm) as with rlhfkit's own sampler?
SmolLM2-135M-Instruct (fp32), a reward that a program checks, several seeds per row:
    .venv-vllm/bin/python -m bench vllm_learning [--task brief|number] [--steps N] [--seeds 0,1,2] [--rows ...]
--task brief (the default): chat prompts (short arithmetic questions that ask for the number alone, and a few
one-word questions); the reward ``brief``: 1 for a reply of at most three words, else 0. The instruct model
answers briefly about one time in 25 at the start, so the first steps see few rewarded replies, and when the
first ones come decides much of a run: one seed's curve says little, several seeds' say more. Replies of up to 24
tokens, 12 steps by default.
--task number: the arithmetic questions alone; the reward ``number_first``: 1 for a reply that starts with a
number. The model does about half the time at the start, so most groups hold a rewarded reply from the first
step and a run's curve varies little with the seed. Replies of up to 8 tokens, 10 steps by default.
GRPO with 4 completions for each of 4 prompts per step, no KL term; full fine-tuning at 2e-5, LoRA (r 16) at 2e-4,
one torch thread per run. Each run is one `rlhfkit grpo` in its own process; its per-step reward, engine /
trainer log-prob gap and groups whose replies all scored the same are kept. The runs, with their stamp
(bench/stamp.py), are merged into --out under the machine and commit (bench/results_file.py); docs/generation.md's
tables read them (bench/report/generation.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent

COMMON = "--num-generations 4 --batch-size 16 --kl-coef 0 --max-prompt-length 128 --threads 1 --progress false"
TASKS = {"brief": {"max_new_tokens": 24, "steps": 12}, "number": {"max_new_tokens": 8, "steps": 10}}
ROWS = {
    "own": "--learning-rate 2e-5",
    "vllm": "--learning-rate 2e-5 --use-vllm",
    "own-lora": "--learning-rate 2e-4 --lora-r 16 --lora-alpha 32",
    "vllm-lora": "--learning-rate 2e-4 --lora-r 16 --lora-alpha 32 --use-vllm",
}
WORDS = ["Name a colour.", "Name a fruit.", "Name a planet.", "Name a month.", "Name a metal.", "Say hello."]


def brief(completions, **kwargs) -> list[float]:
    """The reward (``--reward-fn bench/learning/vllm_learning.py:brief``): 1 for a reply of at most three words, else 0."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if len(t.split()) <= 3 else 0.0 for t in texts]


def number_first(completions, **kwargs) -> list[float]:
    """The reward of --task number: 1 for a reply that starts with a number, else 0."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if re.match(r"\s*\d", t) else 0.0 for t in texts]


REWARDS = {"brief": "brief", "number": "number_first"}


def write_prompts(path: Path, seed: int = 0, task: str = "brief") -> Path:
    """48 arithmetic questions and (--task brief) the one-word questions, as chat prompts."""
    rng = random.Random(seed)
    questions = [f"What is {rng.randint(2, 20)} + {rng.randint(2, 20)}? Reply with only the number." for _ in range(48)]
    with open(path, "w") as f:
        for q in questions + (WORDS if task == "brief" else []):
            f.write(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n")
    return path


def run_one(row: str, seed: int, model: Path, data: Path, steps: int, work: Path, task: str = "brief") -> dict:
    out = work / f"{row}-{seed}"
    argv = [sys.executable, "-m", "rlhfkit.cli.main", "grpo", *COMMON.split(), *ROWS[row].split()]
    argv += ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--max-steps", str(steps)]
    argv += ["--max-new-tokens", str(TASKS[task]["max_new_tokens"]), "--seed", str(seed)]
    argv += ["--reward-fn", f"{Path(__file__).resolve()}:{REWARDS[task]}"]
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    return {
        "row": row,
        "seed": seed,
        "reward": [r[f"reward/{REWARDS[task]}"] for r in rows],
        "zero_std_groups": [r.get("rollout/zero_std_groups") for r in rows],
        "logprob_diff": [r.get("rollout/logprob_diff") for r in rows],
    }


DEFAULTS = {"task": "brief", "steps": 12, "seeds": "0,1,2", "rows": "own,vllm,vllm-lora,own-lora"}


def main(argv: list[str] | None = None) -> None:
    # imported here, not at the top: each run loads this file on its own as its reward file (--reward-fn)
    from bench import results_file
    from bench.speed.vllm_engine import smollm2_folder
    from bench.stamp import Stamp, summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default=DEFAULTS["task"])
    parser.add_argument("--steps", type=int, default=None, help="default: 12 (brief), 10 (number)")
    parser.add_argument("--seeds", default=DEFAULTS["seeds"])
    parser.add_argument("--rows", default=DEFAULTS["rows"])
    parser.add_argument("--out", default=str(BENCH / "results" / "vllm_learning.json"))
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = TASKS[args.task]["steps"]
    stamp = Stamp()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model = smollm2_folder()
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-learning-"))
    data = write_prompts(work / "prompts.jsonl", task=args.task)
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for row in args.rows.split(","):
            results.append(run_one(row, seed, model, data, args.steps, work, args.task))
            r = results[-1]
            print(f"{row:9s} seed {seed}: " + " ".join(f"{x:.2f}" for x in r["reward"]), flush=True)
            # written after every run, so that an interrupted sweep keeps the runs it finished
            record = stamp.record()
            key = results_file.run_key(record["commit"], vars(args), DEFAULTS)
            settings = {"common": COMMON, **TASKS[args.task], **ROWS}
            run = {"stamp": record, "args": vars(args), "settings": settings, "results": results}
            results_file.merge(Path(args.out), "vllm_learning", results_file.machine_key(record), key, run)
    print(summary(record))


if __name__ == "__main__":
    main()
