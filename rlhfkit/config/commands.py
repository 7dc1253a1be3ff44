"""One config dataclass per command, composed of the shared parts in ``parts.py``.

Command-specific defaults are set by constructing a part with other values (``default_factory``), so
an option keeps one definition and one docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rlhfkit.config import options
from rlhfkit.config.parts import DataArgs, GenerationArgs, LoraArgs, ModelArgs, OptimArgs, PackingArgs, RunArgs
from rlhfkit.errors import UserError


def _positive(**values) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0, got {value}")


def _at_least(low, **values) -> None:
    for name, value in values.items():
        if value < low:
            raise UserError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")


def _check_training(optim: OptimArgs, run: RunArgs, lora: LoraArgs | None = None) -> None:
    _positive(
        learning_rate=optim.learning_rate,
        batch_size=optim.batch_size,
        gradient_accumulation_steps=optim.gradient_accumulation_steps,
        num_epochs=optim.num_epochs,
        logging_steps=run.logging_steps,
        save_total_limit=run.save_total_limit,
    )
    _at_least(
        0,
        warmup_steps=optim.warmup_steps,
        weight_decay=optim.weight_decay,
        max_grad_norm=optim.max_grad_norm,
        eval_steps=run.eval_steps,
        save_steps=run.save_steps,
    )
    if optim.max_steps == 0 or optim.max_steps < -1:
        raise UserError(f"--max-steps must be > 0 or -1, got {optim.max_steps}")
    if lora is not None:
        _at_least(0, lora_r=lora.lora_r)


@dataclass
class InitModelConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("output_dir", "corpus")
    output_dir: str = ""
    """Directory to write the model and tokenizer to."""
    corpus: str = ""
    """Text file (or JSONL: every string value is used) to train the BPE tokenizer on."""
    arch: Literal["gpt2", "llama"] = "gpt2"
    """Model architecture."""
    size: Literal["tiny", "small"] = "tiny"
    """tiny is about 0.25M parameters, small about 10M."""
    vocab_size: int = 0
    """BPE vocabulary size; 0 uses the size's default (1024 tiny, 4096 small)."""
    seed: int = options.seed()

    def check(self) -> None:
        _at_least(0, vocab_size=self.vocab_size)


@dataclass
class SFTConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    data: DataArgs = field(default_factory=DataArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)
    packing: PackingArgs = field(default_factory=PackingArgs)
    run: RunArgs = field(default_factory=RunArgs)

    def check(self) -> None:
        _check_training(self.optim, self.run, self.lora)


@dataclass
class RewardArgs:
    center_coef: float = 0.0
    """Reward centering: adds center_coef x mean((s_chosen + s_rejected)^2) so scores stay near 0."""
    ensemble: int = 1
    """Train K reward models with seeds seed..seed+K-1 (OUT = member 0, OUT/member-i); scores are their mean
    (and std)."""
    conservative_k: float = 1.0
    """Ensemble conservative score = mean - conservative_k x std."""


@dataclass
class RMConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    data: DataArgs = field(default_factory=DataArgs)
    reward: RewardArgs = field(default_factory=RewardArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)
    packing: PackingArgs = field(default_factory=PackingArgs)
    run: RunArgs = field(default_factory=RunArgs)

    def check(self) -> None:
        _check_training(self.optim, self.run)
        _positive(ensemble=self.reward.ensemble)
        _at_least(0, center_coef=self.reward.center_coef, conservative_k=self.reward.conservative_k)


@dataclass
class PPOArgs:
    reward_model: str = ""
    """Reward model directory (AutoModelForSequenceClassification with one label), made by `rlhfkit rm`."""
    value_model: str = ""
    """Separate value model directory (e.g. the reward model, as InstructGPT); empty: a value head on the policy."""
    ppo_epochs: int = 4
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Minibatches per PPO epoch (the rollout batch is split into this many)."""
    clip_eps: float = 0.2
    """PPO clipping range epsilon for the probability ratio."""
    vf_coef: float = 0.1
    """c1: weight of the value loss."""
    value_clip: float | None = 0.2
    """Clip the value update to old value +- this; none disables."""
    entropy_coef: float = 0.0
    """c2: weight of the entropy bonus."""
    kl_loss_coef: float = 0.0
    """c3: weight of a KL-to-reference term added to the loss (besides the KL penalty in the reward)."""
    kl_coef: float = 0.05
    """beta: initial coefficient of the per-token KL penalty in the reward."""
    target_kl: float | None = None
    """Set to adapt beta toward this per-sequence KL (Ziegler et al. 2019); none keeps beta fixed."""
    kl_horizon: int = 10000
    """Horizon (in samples) of the adaptive KL controller."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """Per-token KL estimator in the reward: k1 = lp - lp_ref, k2 = (lp - lp_ref)^2/2, k3 = exp(-d) - 1 + d."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda."""
    advantage: Literal["gae", "sequence"] = "gae"
    """gae: per-token GAE; sequence: A = R - V(s) for the whole response."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0, std 1 over the batch."""
    normalize_reward: bool = True
    """Standardise RM scores with the mean/std saved beside the reward model."""
    reward_clip: float | None = 10.0
    """Clip (normalised) scores to +- this; none disables."""
    ensemble_mode: Literal["mean", "conservative"] = "mean"
    """For an ensemble reward model: use the mean score, or mean - k x std."""
    missing_eos_penalty: float | None = None
    """Subtract this from the score of responses that never emit EOS; none disables."""
    ref_update_steps: int = 0
    """Copy the policy into the reference every N steps (0: never)."""
    sample_steps: int = 10
    """Append sample generations to samples.jsonl every N steps."""
    gold_judge: str = ""
    """Name of a built-in task judge (e.g. 'support') to log reward/gold on --eval-data prompts."""
    gold_steps: int = 10
    """Log reward/gold every N steps (when --gold-judge is set)."""


@dataclass
class PPOConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "reward_model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    data: DataArgs = field(default_factory=DataArgs)
    ppo: PPOArgs = field(default_factory=PPOArgs)
    generation: GenerationArgs = field(default_factory=GenerationArgs)
    optim: OptimArgs = field(default_factory=lambda: OptimArgs(learning_rate=1e-5, batch_size=16, max_steps=100))
    packing: PackingArgs = field(default_factory=PackingArgs)
    run: RunArgs = field(default_factory=RunArgs)

    def check(self) -> None:
        _check_training(self.optim, self.run, self.lora)
        p = self.ppo
        _positive(
            ppo_epochs=p.ppo_epochs,
            num_minibatches=p.num_minibatches,
            clip_eps=p.clip_eps,
            target_kl=p.target_kl,
            kl_horizon=p.kl_horizon,
            temperature=self.generation.temperature,
            max_new_tokens=self.generation.max_new_tokens,
            value_clip=p.value_clip,
        )
        _at_least(
            0,
            kl_coef=p.kl_coef,
            vf_coef=p.vf_coef,
            entropy_coef=p.entropy_coef,
            kl_loss_coef=p.kl_loss_coef,
            ref_update_steps=p.ref_update_steps,
        )
        if self.optim.batch_size % (p.num_minibatches * self.optim.gradient_accumulation_steps):
            raise UserError("--batch-size must be divisible by --num-minibatches x --gradient-accumulation-steps")
        if p.ref_update_steps and self.lora.lora_r:
            raise UserError("--ref-update-steps needs full fine-tuning: with LoRA the reference is the base weights")
        if not (0 <= p.gamma <= 1 and 0 <= p.lam <= 1):
            raise UserError("--gamma and --lam must be in [0, 1]")


@dataclass
class DPOArgs:
    beta: float = 0.1
    """DPO beta: strength of the implicit KL constraint to the reference."""
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"
    """sigmoid: DPO (Rafailov et al. 2023); ipo: squared loss (Azar et al. 2023)."""
    label_smoothing: float = 0.0
    """Conservative DPO: assumed probability that a preference label is flipped (sigmoid loss only)."""
    precompute_ref: bool = False
    """Compute the reference log-probs of every training pair once before training, saving one reference
    forward pass per step."""


@dataclass
class DPOConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    data: DataArgs = field(default_factory=DataArgs)
    dpo: DPOArgs = field(default_factory=DPOArgs)
    optim: OptimArgs = field(default_factory=lambda: OptimArgs(learning_rate=5e-6))
    packing: PackingArgs = field(default_factory=PackingArgs)
    run: RunArgs = field(default_factory=RunArgs)

    def check(self) -> None:
        _check_training(self.optim, self.run, self.lora)
        _positive(beta=self.dpo.beta)
        if not 0 <= self.dpo.label_smoothing < 0.5:
            raise UserError(f"--label-smoothing must be in [0, 0.5), got {self.dpo.label_smoothing}")
        if self.dpo.loss_type == "ipo" and self.dpo.label_smoothing != 0:
            raise UserError("--label-smoothing applies to --loss-type sigmoid only, not ipo")


@dataclass
class IOArgs:
    data: str = ""
    """Input rows (.jsonl, .json, .parquet or a datasets folder)."""
    output: str = ""
    """Output file: JSONL rows (generate, score), or a JSON of metrics with the samples in FILE.samples.jsonl (eval)."""
    batch_size: int = options.batch_size(16)
    seed: int = options.seed()
    cpu: bool = options.cpu()
    max_prompt_length: int = options.max_prompt_length()


def _check_sampling(io: IOArgs, generation: GenerationArgs) -> None:
    _positive(batch_size=io.batch_size, temperature=generation.temperature, max_new_tokens=generation.max_new_tokens)


@dataclass
class GenerateConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output")
    model: ModelArgs = field(default_factory=ModelArgs)
    io: IOArgs = field(default_factory=IOArgs)
    generation: GenerationArgs = field(default_factory=GenerationArgs)

    def check(self) -> None:
        _check_sampling(self.io, self.generation)


@dataclass
class ScoreArgs:
    reward_model: str = ""
    """Reward model directory made by `rlhfkit rm` (or any one-label sequence classifier)."""
    trust_remote_code: bool = options.trust_remote_code()


@dataclass
class ScoreConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("reward_model", "data", "output")
    score: ScoreArgs = field(default_factory=ScoreArgs)
    io: IOArgs = field(default_factory=IOArgs)

    def check(self) -> None:
        _positive(batch_size=self.io.batch_size)


@dataclass
class EvalArgs:
    reward_model: str = ""
    """Reward model directory to score the samples with (optional)."""
    reference_model: str = ""
    """Reference policy directory (e.g. the SFT model) to measure KL(policy || reference) against (optional)."""
    gold_judge: str = ""
    """Name of a built-in task judge (e.g. 'support') to report the gold score (optional)."""
    num_prompts: int = 0
    """Evaluate on the first N prompts only (0: all)."""


@dataclass
class EvalConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output")
    model: ModelArgs = field(default_factory=ModelArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)
    io: IOArgs = field(default_factory=IOArgs)
    generation: GenerationArgs = field(default_factory=GenerationArgs)

    def check(self) -> None:
        _check_sampling(self.io, self.generation)
        _at_least(0, num_prompts=self.eval.num_prompts)


@dataclass
class DemoConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    output_dir: str = "runs/demo"
    """Where the data, every stage's model, report.md, summary.json and the plots go."""
    seed: int = options.seed(0)
    arch: Literal["gpt2", "llama"] = "gpt2"
    """Architecture of the small model the demo trains."""
    size: Literal["tiny", "small"] = "tiny"
    """Model size; tiny (~0.25M parameters) runs in minutes on a laptop CPU."""
    quick: bool = False
    """A few steps per stage: checks the wiring in seconds; the numbers mean nothing."""
    progress: bool = True
    """Show progress bars of the stages."""
    threads: int = 1
    """torch CPU threads; a tiny model runs fastest on one (more threads only add synchronisation)."""
