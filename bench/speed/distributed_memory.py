"""Memory per GPU of each multi-process mode, from parameter counts, checked against a real run; and 1 vs 2
processes on this machine.

    python -m bench distributed_memory [--gpus 8] [--skip-runs]

1. The table: bytes per GPU for the model states of PPO and GRPO at 1B, 7B and 70B parameters under DDP,
   ZeRO-2, ZeRO-3, FSDP2 and LoRA with one backbone, on --gpus GPUs. rlhfkit trains in fp32 weights with bf16
   autocast, so a trained model costs 16 bytes per parameter (weights 4, gradients 4, Adam's two moments 8),
   and a frozen one (reference, reward model) 4; frozen models are kept whole on every process (not
   sharded). PPO: policy with a value head (trained), reference and reward model (frozen), all of the
   policy's size. GRPO: policy (trained) and reference (frozen), rewards from functions. LoRA (r=16 on all
   linear layers, ~0.5% of the parameters trained): one frozen backbone that is also the reference, plus the
   reward model for PPO. Activations and the KV cache come on top; they depend on batch and length.
2. The check: the same formula against the bytes a real single-process PPO/GRPO step holds in parameters,
   gradients and optimizer state (counted from the tensors after one update) at the small size.
3. Runs: `rlhfkit grpo` with 1 process and with 2 (torchrun, gloo), tiny and small models: seconds per step
   (median of steps 2..N) and the peak RSS of the largest process. On a 2-core machine 2 processes cannot be
   faster than 1; the point is what the overhead is.
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

TRAINED, FROZEN = 16, 4  # bytes per parameter
LORA_TRAINED_SHARE = 0.005
GIB = 1024**3


def per_gpu(params: float, algo: str, mode: str, gpus: int) -> float:
    """Bytes of model states per GPU."""
    frozen = 2 if algo == "ppo" else 1  # reference (+ reward model)
    if mode == "DDP":
        trained = TRAINED * params
    elif mode == "ZeRO-2":
        trained = 4 * params + (TRAINED - 4) * params / gpus  # weights whole; gradients + Adam sharded
    elif mode in ("ZeRO-3", "FSDP2"):
        trained = TRAINED * params / gpus
    elif mode == "LoRA":
        frozen -= 1  # the backbone with adapters off is the reference
        trained = FROZEN * params + TRAINED * LORA_TRAINED_SHARE * params
    else:
        raise ValueError(mode)
    return trained + frozen * FROZEN * params


def table(gpus: int) -> str:
    modes = ["DDP", "ZeRO-2", "ZeRO-3", "FSDP2", "LoRA"]
    lines = [f"model states per GPU (GiB) on {gpus} GPUs, fp32 weights + Adam, frozen models whole", ""]
    lines.append(f"{'algorithm':<10} {'size':>5} " + " ".join(f"{m:>8}" for m in modes))
    for algo in ("ppo", "grpo"):
        for size, params in (("1B", 1e9), ("7B", 7e9), ("70B", 70e9)):
            cells = " ".join(f"{per_gpu(params, algo, m, gpus) / GIB:8.1f}" for m in modes)
            lines.append(f"{algo:<10} {size:>5} {cells}")
    return "\n".join(lines)


def task_files(folder: Path, n_prompts: int) -> tuple[Path, Path]:
    """A prompts file and a reward-function file (shorter replies score higher) for the runs below."""
    prompts = folder / "p.jsonl"
    lines = (json.dumps({"prompt": f"Customer: my order {i} is late\nAgent:"}) + "\n" for i in range(n_prompts))
    prompts.write_text("".join(lines))
    reward = folder / "r.py"
    reward.write_text("def short(prompts, completions, **k):\n    return [-len(c) / 50 for c in completions]\n")
    return prompts, reward


def measured_state_bytes(model_dir: Path, algo: str) -> tuple[int, int, int]:
    """(parameters of the policy, bytes predicted by the formula on one process, bytes held by the tensors)
    after one real optimizer step of the online trainer."""
    import torch

    import rlhfkit.trainers.online as online
    from rlhfkit.cli.main import COMMANDS
    from rlhfkit.config.parse import parse_config

    captured = {}
    original, zero_grad = online.OnlineTrainer.step, torch.optim.Optimizer.zero_grad

    def step(self, batch):
        out = original(self, batch)
        captured["trainer"] = self
        return out

    def recording_zero_grad(self, set_to_none: bool = True):
        # just after optimizer.step(): weights, gradients and Adam's moments all exist (the peak of the update)
        params = [p for group in self.param_groups for p in group["params"]]
        held = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
        held += sum(t.numel() * t.element_size() for s in self.state.values() for t in s.values() if t.dim() > 0)
        captured["grads_and_moments"] = max(captured.get("grads_and_moments", 0), held)
        return zero_grad(self, set_to_none)

    online.OnlineTrainer.step = step
    torch.optim.Optimizer.zero_grad = recording_zero_grad
    with tempfile.TemporaryDirectory() as tmp:
        prompts, reward = task_files(Path(tmp), 8)
        argv = ["--model", str(model_dir), "--data", str(prompts), "--reward-fn", f"{reward}:short"]
        argv += ["--output-dir", f"{tmp}/out", "--max-steps", "1", "--batch-size", "8", "--max-new-tokens", "8"]
        argv += ["--progress", "false"] + (["--num-generations", "4"] if algo == "grpo" else [])
        cfg, _ = parse_config(f"rlhfkit {algo}", COMMANDS[algo].config, argv)
        online.train(cfg)
    torch.optim.Optimizer.zero_grad = zero_grad
    trainer = captured["trainer"]
    model = trainer.accelerator.unwrap_model(trainer.actor_critic)
    params = list(model.parameters())
    held = sum(p.numel() * p.element_size() for p in params) + captured["grads_and_moments"]
    frozen = [trainer.ref_model] if trainer.ref_model is not None else []
    held += sum(p.numel() * p.element_size() for m in frozen for p in m.parameters())
    n_policy = sum(p.numel() for p in model.policy.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    predicted = TRAINED * trainable + FROZEN * sum(p.numel() for m in frozen for p in m.parameters())
    return n_policy, predicted, held


PEAK = "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
PEAK += "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"


def timed_runs(model_dir: Path, nproc: int) -> tuple[float, float]:
    """(median s/step, peak RSS MiB of the largest process) of a 12-step `rlhfkit grpo`."""
    with tempfile.TemporaryDirectory() as tmp:
        prompts, reward = task_files(Path(tmp), 32)
        args = ["grpo", "--model", str(model_dir), "--data", str(prompts), "--reward-fn", f"{reward}:short"]
        args += ["--output-dir", f"{tmp}/out", "--max-steps", "12", "--batch-size", "16", "--num-generations", "4"]
        args += ["--max-new-tokens", "32", "--progress", "false"]
        launch = (
            [sys.executable, "-m", "rlhfkit"]
            if nproc == 1
            else [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(nproc),
                "-m",
                "rlhfkit",
            ]
        )
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // nproc))}
        # a fresh parent per run: RUSAGE_CHILDREN's maxrss is the largest process it waited for (the
        # launcher passes its workers' on), never lowered by a later, smaller run
        done = subprocess.run([sys.executable, "-c", PEAK, *launch, *args], check=True, env=env, capture_output=True)
        peak_kib = int(done.stdout.split()[-1])
        steps = [json.loads(x)["time/step_s"] for x in (Path(tmp) / "out" / "metrics.jsonl").read_text().splitlines()]
        return statistics.median(steps[1:]), peak_kib / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--skip-runs", action="store_true", help="only the table and the check, no timed runs")
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "rlhfkit-bench-dist"))
    args = parser.parse_args(argv)
    print(table(args.gpus))
    work = Path(args.work_dir)
    models = {}
    for size in ("tiny", "small"):
        models[size] = work / size
        if not (models[size] / "config.json").is_file():
            corpus = work / "corpus.txt"
            work.mkdir(parents=True, exist_ok=True)
            corpus.write_text(
                "\n".join(f"Customer: my order {i} is late\nAgent: sorry about order {i}." for i in range(400))
            )
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rlhfkit",
                    "init-model",
                    "--output-dir",
                    str(models[size]),
                    "--corpus",
                    str(corpus),
                    "--size",
                    size,
                ],
                check=True,
                capture_output=True,
            )
    print("\ncheck of the formula against one real step (single process, small model)")
    print(f"{'algorithm':<10} {'policy params':>14} {'predicted MiB':>14} {'held MiB':>10}")
    for algo in ("ppo", "grpo"):
        n, predicted, held = measured_state_bytes(models["small"], algo)
        print(f"{algo:<10} {n:>14,} {predicted / 2**20:>14.2f} {held / 2**20:>10.2f}")
    if args.skip_runs:
        return
    print(f"\n1 vs 2 processes, rlhfkit grpo (batch 16, G 4, 32 new tokens), load {os.getloadavg()[0]:.1f} at start")
    print(f"{'size':<6} {'procs':>5} {'s/step':>8} {'peak RSS MiB':>13}")
    for size in ("tiny", "small"):
        for nproc in (1, 2):
            started = time.perf_counter()
            s, rss = timed_runs(models[size], nproc)
            print(f"{size:<6} {nproc:>5} {s:>8.3f} {rss:>13.0f}   ({time.perf_counter() - started:.0f} s)")
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
