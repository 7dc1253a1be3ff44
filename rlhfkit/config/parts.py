"""Config parts shared by the commands. Each option is defined once here, documented by the string under it.

A command's config (see ``commands.py``) is a dataclass composed of these parts; the CLI flattens the
parts, so ``--learning-rate`` reaches ``cfg.optim.learning_rate``. Field names are unique within a command.
Options that several parts share (seed, cpu, batch size, trust-remote-code, prompt length) come from
``options.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhfkit.config import options


@dataclass
class ModelArgs:
    model: str = ""
    """Local directory of a Hugging Face causal LM (config.json, *.safetensors, tokenizer files), a .gguf file
    (de-quantised to fp32 once and cached; needs `pip install 'rlhfkit[gguf]'`), or a LoRA adapter folder on
    one (what --save-merged false writes), loaded with the adapter merged in."""
    trust_remote_code: bool = options.trust_remote_code()


@dataclass
class LoraArgs:
    lora_r: int = 0
    """LoRA rank; 0 trains all weights. With LoRA the frozen reference is the same backbone with adapters off;
    a reward model's score head (rm, and ppo's --value-model) trains in full beside its adapters."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input."""
    lora_target_modules: str = "all-linear"
    """Comma-separated module names to adapt, or 'all-linear'."""
    save_merged: bool = True
    """With LoRA, write the final model with the adapter merged into full weights (loadable by every command)
    and the adapter under OUT/adapter/; false: only the adapter (and the tokenizer) in OUT, a few megabytes,
    which every command loads as the merged model while its base stays where it was (as do
    PeftModel.from_pretrained(base, OUT) and `rlhfkit merge --adapter OUT`)."""


@dataclass
class DataArgs:
    data: str = ""
    """Training data: a .jsonl, .json or .parquet file, or a datasets.save_to_disk folder."""
    eval_data: str = ""
    """Held-out data in the same format; evaluated every --eval-steps and at the end (ppo, grpo, rloo: prompts,
    sampled by the policy and measured with the run's rewards, KL and length into eval/ metrics and
    eval_samples.jsonl; --gold-judge also scores them every --gold-steps)."""
    max_length: int = 256
    """Longest prompt + response in tokens; longer rows are truncated (response end first, then prompt start) and
    counted in a note at the start."""
    max_prompt_length: int = options.max_prompt_length()


@dataclass
class OptimArgs:
    learning_rate: float = 2e-5
    """Peak learning rate of AdamW."""
    batch_size: int = options.batch_size(8)
    gradient_accumulation_steps: int = 1
    """Micro-batches each process splits its share of a step's --batch-size rows into (one backward each, one
optimizer step): the same update with less memory."""
    max_steps: int = -1
    """Optimizer steps to run; -1 derives them from --num-epochs."""
    num_epochs: float = 1.0
    """Passes over the training data when --max-steps is -1."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from 0."""
    lr_scheduler: Literal["linear", "cosine", "constant"] = "linear"
    """Learning-rate decay after warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay (not applied to biases and norms)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    gradient_checkpointing: bool = False
    """Recompute each transformer layer's activations during the backward pass instead of keeping them: the
activation memory of one layer instead of all of them, for roughly a third more compute per step."""
    optimizer_state: str = ""
    """Start AdamW's moments and the learning-rate schedule's position from an earlier run of the same model
    and options (its checkpoint folder OUT/checkpoints/step-N, its OUT folder for the newest checkpoint, or a
    trainer_state.pt) instead of afresh, as when one run goes on with new data; the weights still come from
    --model, this run's learning rate and other settings stay. One process or DDP only."""
    schedule_steps: int = 0
    """Steps the learning-rate schedule runs over (0: this run's steps); with --optimizer-state, the whole
    length of the runs it continues, so the rate decays once over all of them."""


@dataclass
class RunArgs:
    output_dir: str = ""
    """Where the final model, metrics.jsonl, tensorboard/, checkpoints/ and config.yaml go."""
    seed: int = options.seed()
    logging_steps: int = 1
    """Log metrics every N steps."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers that get the logged metrics and the run's options (metrics.jsonl is written in any
    case): tensorboard (to OUT/tensorboard/), wandb, trackio, mlflow; several at once (--report-to wandb
    tensorboard, or wandb,tensorboard), all (every one installed) or none. wandb, trackio and mlflow are
    installed apart: pip install 'rlhfkit[wandb]' (or [trackio], [mlflow]); see docs/trackers.md."""
    project: str = ""
    """The trackers' project (mlflow: experiment); unset: WANDB_PROJECT or MLFLOW_EXPERIMENT_NAME when set, else
    rlhfkit."""
    run_name: str = ""
    """The run's name in the trackers; unset: the --output-dir folder's name."""
    eval_steps: int = 0
    """Evaluate on --eval-data every N steps (0: only at the end; -1: never, the rows still checked; PPO, GRPO
    and RLOO still log --gold-judge's score on its prompts)."""
    save_steps: int = 0
    """Write a checkpoint every N steps (0: none besides the final model)."""
    save_total_limit: int = 2
    """Keep only the newest N checkpoints."""
    resume: bool = False
    """Continue from the newest complete checkpoint in --output-dir."""
    overwrite_output_dir: bool = False
    """Empty --output-dir first when it holds another run (metrics, checkpoints, a model); without this or
    --resume such a folder stops the command, so no run is written over by mistake."""
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """Autocast precision; 'auto' is bf16 on a GPU that supports it, else full precision. On a CPU with native
    bf16 matmuls (AVX512-BF16 / AMX), 'bf16' can speed up models of a few million parameters and up; for tiny
    models the casts cost more than they save."""
    cpu: bool = options.cpu()
    threads: int = options.threads()
    progress: bool = True
    """Show a progress bar."""
    dist_timeout: int = options.dist_timeout()
    accel: Literal["auto", "off"] = options.accel()

    def evaluates(self) -> bool:
        """Whether the held-out evaluation on --eval-data runs at all (not with --eval-steps -1)."""
        return self.eval_steps != -1


@dataclass
class StoppingArgs:
    keep_best: bool = False
    """Keep the weights of the held-out evaluation with the lowest eval/loss (every --eval-steps on --eval-data)
    rather than the last step's: the final model, and a reward model's score statistics, come from that step.
    After --resume the best is tracked from the resumed step on."""
    patience: int = 0
    """Stop once this many held-out evaluations in a row have not lowered eval/loss (0: train every step).
    Needs --eval-data and --eval-steps > 0."""


@dataclass
class PackingArgs:
    pack_sequences: bool = True
    """Run teacher-forced passes (forward/backward, log-probs, values, reward scores) on packed rows: several
sequences per row with block-diagonal attention instead of padding; same results, fewer positions. For GPT-2,
Llama, Qwen2, GPT-NeoX with sdpa/eager attention, on the CPU under --accel auto, on batches where it is estimated
cheaper; false: padded."""


@dataclass
class GenerationArgs:
    max_new_tokens: int = 32
    """Most tokens sampled per response; sampling stops early at EOS."""
    truncate_prompts: bool = False
    """Keep the last --max-prompt-length tokens of a longer prompt (a note at the start counts them); false: a
    prompt longer than --max-prompt-length stops the run, saying how many there are and the longest."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 disables."""
    top_p: float = 1.0
    """Nucleus sampling: smallest set of tokens with this total probability; 1.0 disables."""
    compile_decode: bool = False
    """Compile the one-token decode step with torch.compile (GPT-2, Llama, Qwen2): tens of seconds to compile once
per process, then faster sampling where the step is dispatch-bound (small models on CPU); no gain for a model
whose step is its matmuls. Samples match the eager step's up to float rounding. Applies under --accel auto only."""
