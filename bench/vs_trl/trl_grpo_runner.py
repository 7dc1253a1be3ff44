"""Runs Hugging Face TRL 1.16's ``GRPOTrainer`` for bench/vs_trl/grpo_vs_trl.py, and its ``SFTTrainer``, ``DPOTrainer``
and ``RewardTrainer`` for bench/vs_trl/real_model.py (the spec's ``"trainer"``: grpo, the default, sft, dpo or reward).

Runs inside bench/.venv-trl-grpo (made by bench/vs_trl/setup_trl_grpo_env.sh); rlhfkit is not importable there. It
reads a JSON spec written by grpo_vs_trl.py (the SFT policy, the training prompts as text together with the
token ids rlhfkit encodes them to, the reward function's file and name, the shared GRPO settings; for the other
trainers the rows as text), trains on the CPU in fp32 (GRPO with transformers' generate, no vLLM), optionally
with LoRA (``"lora_r"``: peft on every linear layer, ``"lora_alpha"``, no dropout: rlhfkit's --lora-r) or gradient
checkpointing (``"gradient_checkpointing"``, off unless given), and writes:

    OUT/policy/            the final GRPO policy (Hugging Face format), sampled later by the benchmark
                           (``"save": false`` skips it)
    OUT/bench_result.json  step end times, generated tokens and TRL's own phase timings per step (GRPO), TRL's
                           logged metrics, start-up time, peak RSS

TRL's code is not changed: step boundaries come from a ``TrainerCallback`` (trl_clock.py), and the phase
timings from a wrapper around TRL's profiling context that records the durations TRL measures itself (it
otherwise reports them only to wandb, mlflow or trackio).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

START = time.perf_counter()
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import (  # noqa: E402
    DPOConfig,
    DPOTrainer,
    GRPOConfig,
    GRPOTrainer,
    RewardConfig,
    RewardTrainer,
    SFTConfig,
    SFTTrainer,
)
from trl.extras.profiling import ProfilingContext  # noqa: E402
from trl_clock import StepClock  # noqa: E402


class PhaseTimes(TrainerCallback):
    """Seconds per step of each block TRL profiles (``GRPOTrainer.transformers.generate``,
    ``GRPOTrainer._calculate_rewards``, ``GRPOTrainer._prepare_inputs``, ``GRPOTrainer.compute_loss``, ...),
    summed within the step; one dict per optimizer step."""

    def __init__(self):
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        original = ProfilingContext._log_metrics
        phases = self

        def record(context, duration: float) -> None:
            phases.current[context.name] += duration
            original(context, duration)

        ProfilingContext._log_metrics = record

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(dict(self.current))
        self.current.clear()


def load_reward(path: str, name: str):
    spec = importlib.util.spec_from_file_location("bench_grpo_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def lora(spec: dict, task_type: str):
    """The peft config of rlhfkit's --lora-r with its defaults (every linear layer, no dropout), or None."""
    if not spec.get("lora_r"):
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=spec["lora_r"],
        lora_alpha=spec.get("lora_alpha", 16.0),
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type=task_type,
    )


def common_args(spec: dict, out: Path) -> dict:
    """What every trainer here is configured with: the CPU in fp32, the optimisation settings, no saving."""
    s = spec["settings"]
    return dict(
        output_dir=str(out / "trl"),
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=s["batch_size"],
        gradient_accumulation_steps=1,
        max_steps=spec["steps"],
        learning_rate=s["learning_rate"],
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=s["max_grad_norm"],
        # TRL's default is on; rlhfkit's is off (each row names what it uses)
        gradient_checkpointing=spec.get("gradient_checkpointing", False),
        bf16=False,  # TRL's default is bf16 where available; fp32 as rlhfkit's --mixed-precision no
        fp16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=spec["seed"],
    )


def offline_trainer(spec: dict, out: Path, tokenizer, callbacks: list):
    """SFTTrainer, DPOTrainer or RewardTrainer on the spec's text rows (``"rows"``: prompt + completion, or prompt
    + chosen + rejected), rows up to ``max_length`` tokens, padded (no packing, no padding-free batches)."""
    kind, s = spec["trainer"], spec["settings"]
    train = Dataset.from_list(spec["rows"])
    base = common_args(spec, out)
    if kind == "sft":
        config = SFTConfig(**base, max_length=s["max_length"], packing=False, padding_free=False)
        make, task = SFTTrainer, "CAUSAL_LM"
    elif kind == "dpo":
        config = DPOConfig(
            **base, max_length=s["max_length"], beta=s["beta"], precompute_ref_log_probs=False, padding_free=False
        )
        make, task = DPOTrainer, "CAUSAL_LM"
    elif kind == "reward":
        config = RewardConfig(**base, max_length=s["max_length"], center_rewards_coefficient=None)
        make, task = RewardTrainer, "SEQ_CLS"
    else:
        raise SystemExit(f"trl_grpo_runner: unknown trainer {kind!r}")
    return make(
        model=spec["policy"],
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=lora(spec, task),
    )


def grpo_trainer(spec: dict, out: Path, tokenizer, callbacks: list):
    # TRL tokenizes text prompts itself (``processing_class(text=prompts)``); they must become the token ids
    # rlhfkit trains on, or the two frameworks would not see the same prompts.
    encoded = tokenizer(text=spec["train_prompts"])["input_ids"]
    mismatched = [i for i, (a, b) in enumerate(zip(encoded, spec["train_ids"])) if list(a) != list(b)]
    if mismatched:
        raise SystemExit(f"trl_grpo_runner: prompt rows {mismatched[:5]} tokenize differently from rlhfkit's encoding")
    train = Dataset.from_dict({"prompt": spec["train_prompts"]})
    reward = load_reward(spec["reward_file"], spec["reward_name"])

    s = spec["settings"]
    config = GRPOConfig(
        **common_args(spec, out),
        # one generation batch per optimizer step: B completions (B / G prompts), one update on them
        steps_per_generation=1,
        num_generations=s["num_generations"],
        num_iterations=s["ppo_epochs"],
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=0,
        beta=s["kl_coef"],
        use_bias_correction_kl=False,  # the plain k3 KL in the loss, as rlhfkit's --kl-in-loss
        epsilon=s["clip_eps"],
        loss_type=s["trl_loss_type"],
        scale_rewards=s["scale_rewards"],
        mask_truncated_completions=False,
        disable_dropout=True,  # rlhfkit disables dropout in the policy
        use_vllm=False,
        log_completions=False,
    )
    return GRPOTrainer(
        model=spec["policy"],
        reward_funcs=[reward],
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=lora(spec, "CAUSAL_LM"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="JSON spec written by bench/vs_trl/grpo_vs_trl.py or bench/vs_trl/real_model.py")
    spec = json.loads(Path(parser.parse_args().spec).read_text())
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = Path(spec["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    kind = spec.setdefault("trainer", "grpo")

    tokenizer = AutoTokenizer.from_pretrained(spec["policy"])
    clock = StepClock()
    phases = PhaseTimes()
    if kind == "grpo":
        trainer = grpo_trainer(spec, out, tokenizer, [clock, phases])
    else:
        trainer = offline_trainer(spec, out, tokenizer, [clock])
    trainer.train()
    end = time.perf_counter()
    policy = trainer.accelerator.unwrap_model(trainer.model)
    if kind == "grpo" and spec.get("save", True):
        policy.save_pretrained(out / "policy")
        tokenizer.save_pretrained(out / "policy")
    s = spec["settings"]
    log = [row for row in trainer.state.log_history if "reward" in row]
    result = {
        "framework": "trl",
        "trainer": kind,
        "version": trl.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "startup_s": clock.train_begin - START,
        "train_s": end - clock.train_begin,
        "step_ends": [t - clock.train_begin for t in clock.step_ends],
        "generated_tokens": [round(row["completions/mean_length"] * s["batch_size"]) for row in log],
        "phases": phases.steps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "policy": str(out / "policy"),
        "settings_used": {
            k: getattr(trainer.args, k)
            for k in (
                "per_device_train_batch_size",
                "generation_batch_size",
                "steps_per_generation",
                "num_generations",
                "num_iterations",
                "loss_type",
                "scale_rewards",
                "beta",
                "use_bias_correction_kl",
                "max_length",
                "bf16",
                "gradient_checkpointing",
                "use_vllm",
                "optim",
            )
            if hasattr(trainer.args, k)
        },
        "lora": bool(spec.get("lora_r")),
        "device": str(trainer.accelerator.device),
        "dtype": str(policy.dtype),
        "ref_model": getattr(trainer, "ref_model", None) is not None,
        "log": log if kind == "grpo" else trainer.state.log_history,
    }
    (out / "bench_result.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
