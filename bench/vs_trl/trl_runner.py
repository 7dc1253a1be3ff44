"""Runs Hugging Face TRL's PPO (``trl.experimental.ppo``) for bench/vs_trl/ppo_vs_trl.py.

Runs inside bench/.venv-trl (made by bench/vs_trl/setup_trl_env.sh); rlhfkit is not importable there. It reads a
JSON spec written by ppo_vs_trl.py or real_model.py (model directories, prompt token ids already encoded by
rlhfkit so both frameworks see identical prompts, the shared PPO settings, optionally ``"lora_r"``: peft
adapters on the policy, whose reference is then the same model with adapters off), trains, and writes:

    OUT/policy/            the final policy (Hugging Face format), sampled later by the benchmark (``"save":
                           false`` skips it)
    OUT/bench_result.json  step end times, generated tokens per step, start-up time, peak RSS

TRL's code is not changed: step boundaries come from a ``TrainerCallback`` (trl_clock.py) and the token count
from a thin wrapper around TRL's ``batch_generation`` that only reads its output.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

START = time.perf_counter()
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)
from transformers.utils import logging as hf_logging  # noqa: E402
from trl.experimental.ppo import PPOConfig, PPOTrainer  # noqa: E402
from trl.experimental.ppo import ppo_trainer as trl_ppo  # noqa: E402
from trl_clock import StepClock  # noqa: E402


def count_generated_tokens(eos_id: int, counts: list[int]):
    """Wrap TRL's ``batch_generation``: record the response tokens up to and including the first EOS."""
    original = trl_ppo.batch_generation

    def wrapped(model, queries, *args, **kwargs):
        query_responses, logits = original(model, queries, *args, **kwargs)
        responses = query_responses[:, queries.shape[1] :]
        is_eos = responses == eos_id
        first = torch.where(
            is_eos.any(1),
            is_eos.int().argmax(1) + 1,
            torch.full_like(is_eos[:, 0], responses.shape[1], dtype=torch.long),
        )
        counts.append(int(first.sum()))
        return query_responses, logits

    trl_ppo.batch_generation = wrapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="JSON spec written by bench/vs_trl/ppo_vs_trl.py")
    spec = json.loads(Path(parser.parse_args().spec).read_text())
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = Path(spec["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec["seed"])

    tokenizer = AutoTokenizer.from_pretrained(spec["policy"])
    tokenizer.padding_side = "left"  # TRL generates from the collated (left-padded) queries
    policy = AutoModelForCausalLM.from_pretrained(spec["policy"])
    peft_config = None
    if spec.get("lora_r"):  # rlhfkit's --lora-r defaults: every linear layer, no dropout; reference = adapters off
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=spec["lora_r"],
            lora_alpha=spec.get("lora_alpha", 16.0),
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    ref_policy = None if peft_config else AutoModelForCausalLM.from_pretrained(spec["policy"])
    reward_model = AutoModelForSequenceClassification.from_pretrained(spec["reward_model"], num_labels=1)
    value_model = AutoModelForSequenceClassification.from_pretrained(spec["value_model"], num_labels=1)
    train = Dataset.from_dict({"input_ids": spec["train_ids"]})
    evals = Dataset.from_dict({"input_ids": spec["eval_ids"]})

    s = spec["settings"]
    config = PPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=s["batch_size"],
        gradient_accumulation_steps=1,
        num_mini_batches=s["num_minibatches"],
        num_ppo_epochs=s["ppo_epochs"],
        response_length=s["max_new_tokens"],
        total_episodes=s["batch_size"] * spec["steps"],
        learning_rate=s["learning_rate"],
        temperature=s["temperature"],
        kl_coef=s["kl_coef"],
        kl_estimator="k1",
        vf_coef=s["vf_coef"],
        cliprange=s["clip_eps"],
        cliprange_value=s["value_clip"],
        gamma=s["gamma"],
        lam=s["lam"],
        stop_token="eos",
        missing_eos_penalty=None,
        local_rollout_forward_batch_size=s["batch_size"],  # the whole batch in one generate call, as rlhfkit
        gradient_checkpointing=spec.get("gradient_checkpointing", False),
        bf16=spec.get("bf16", False),  # default fp32, as rlhfkit's --mixed-precision no
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        num_sample_generations=0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=spec["seed"],
        use_cpu=True,
    )
    clock = StepClock()
    generated: list[int] = []
    count_generated_tokens(tokenizer.eos_token_id, generated)
    trainer = PPOTrainer(
        args=config,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        train_dataset=train,
        value_model=value_model,
        eval_dataset=evals,
        callbacks=[clock],
        peft_config=peft_config,
    )
    trainer.train()
    end = time.perf_counter()
    if spec.get("save", True):
        policy.save_pretrained(out / "policy")
        tokenizer.save_pretrained(out / "policy")
    result = {
        "framework": "trl",
        "version": trl.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "startup_s": clock.train_begin - START,
        "train_s": end - clock.train_begin,
        "step_ends": [t - clock.train_begin for t in clock.step_ends],
        "generated_tokens": generated,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "policy": str(out / "policy"),
        "log": trainer.state.log_history,
    }
    (out / "bench_result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
