"""One config dataclass per command, composed of the shared parts in ``parts.py`` (the online-RL commands'
configs, ``PPOConfig``, ``GRPOConfig`` and ``RLOOConfig``, are in ``online.py``; those of the commands that serve
web pages, ``LabelConfig`` and ``ViewConfig``, in ``pages.py``).

Command-specific defaults are set by constructing a part with other values (``default_factory``), so
an option keeps one definition and one docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rlhfkit.config import options
from rlhfkit.config.checks import at_least, check_stopping, check_training, positive
from rlhfkit.config.online import GRPOConfig, PPOConfig, RLOOConfig  # noqa: F401  (every config importable here)
from rlhfkit.config.pages import LabelConfig, ViewConfig  # noqa: F401
from rlhfkit.config.parts import (
    DataArgs,
    GenerationArgs,
    LoraArgs,
    ModelArgs,
    OptimArgs,
    PackingArgs,
    RunArgs,
    StoppingArgs,
)
from rlhfkit.errors import UserError, option
from rlhfkit.ops.losses import DPO_LOSS_TYPES

DPOLossType = Literal[DPO_LOSS_TYPES]
Arch = Literal["gpt2", "llama"]  # the architectures and sizes rlhfkit.models.init_model builds (init-model, demo)
ModelSize = Literal["tiny", "small"]


@dataclass
class InitModelConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("output_dir", "corpus")
    output_dir: str = ""
    """Directory to write the model and tokenizer to."""
    corpus: str = ""
    """Text file (or JSONL: every string value is used) to train the BPE tokenizer on."""
    arch: Arch = "gpt2"
    """Model architecture."""
    size: ModelSize = "tiny"
    """Model size: tiny has 0.24M parameters (gpt2) or 0.27M (llama), small 8.7M (gpt2) or 10.4M (llama), at the
    default vocabulary size; a smaller vocabulary (--vocab-size, or a corpus too small to fill it) gives fewer."""
    vocab_size: int = 0
    """BPE vocabulary size; 0 uses the size's default (1024 tiny, 4096 small)."""
    seed: int = options.seed()
    threads: int = options.threads()

    def check(self) -> None:
        at_least(0, vocab_size=self.vocab_size, threads=self.threads)


@dataclass
class SFTConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    data: DataArgs = field(default_factory=DataArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)
    packing: PackingArgs = field(default_factory=PackingArgs)
    run: RunArgs = field(default_factory=RunArgs)
    stopping: StoppingArgs = field(default_factory=StoppingArgs)

    def check(self) -> None:
        check_training(self.optim, self.run, self.lora)
        check_stopping(self.stopping, self.run, self.data.eval_data)


@dataclass
class RewardArgs:
    center_coef: float = 0.0
    """Reward centering: adds center_coef x mean((s_chosen + s_rejected)^2) so scores stay near 0."""
    ensemble: int = 1
    """Train K reward models with seeds seed..seed+K-1 (OUT = member 0, OUT/member-i); scores are their mean
    (and std)."""
    conservative_k: float = 1.0
    """k of the ensemble's conservative score mean - k x std (what `ppo --ensemble-mode uncertainty` optimises)."""
    weight_average: bool = False
    """With --ensemble K: the members share one initialisation (--seed; seed + i orders member i's data), and
    OUT/average is one reward model whose weights are their mean (WARM, Ramé et al. 2024; LoRA members: one
    adapter of rank K x r), which scores at the cost of one model: give it to ppo as --reward-model OUT/average."""


@dataclass
class RMConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    data: DataArgs = field(default_factory=DataArgs)
    reward: RewardArgs = field(default_factory=RewardArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)
    packing: PackingArgs = field(default_factory=PackingArgs)
    run: RunArgs = field(default_factory=RunArgs)
    stopping: StoppingArgs = field(default_factory=StoppingArgs)

    def check(self) -> None:
        check_training(self.optim, self.run, self.lora)
        check_stopping(self.stopping, self.run, self.data.eval_data)
        positive(ensemble=self.reward.ensemble)
        if self.reward.weight_average and self.reward.ensemble < 2:
            raise UserError(f"{option('weight_average', True)} averages the members of {option('ensemble')} K >= 2")
        at_least(0, center_coef=self.reward.center_coef, conservative_k=self.reward.conservative_k)


@dataclass
class DPOArgs:
    beta: float = 0.1
    """DPO beta: strength of the implicit KL constraint to the reference."""
    loss_type: DPOLossType = "sigmoid"
    """sigmoid: DPO (Rafailov et al. 2023); ipo: squared loss (Azar et al. 2023)."""
    label_smoothing: float = 0.0
    """Conservative DPO: assumed probability that a preference label is flipped (sigmoid loss only)."""
    ref_model: str = ""
    """The reference of the DPO loss: a causal LM folder or .gguf file with the policy's tokenizer (e.g. the SFT
    model when --model starts elsewhere); empty: the starting policy (with LoRA: its backbone with the adapters
    off). With --lora-r, a --model that is a LoRA adapter on this model goes on training that adapter."""
    precompute_ref: bool = False
    """Compute each training pair's reference log-probs once and look them up after: with full fine-tuning all
    before training (the reference copy is then freed), with LoRA each the first time its pair is drawn."""


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
    stopping: StoppingArgs = field(default_factory=StoppingArgs)

    def check(self) -> None:
        check_training(self.optim, self.run, self.lora)
        check_stopping(self.stopping, self.run, self.data.eval_data)
        positive(beta=self.dpo.beta)
        if not 0 <= self.dpo.label_smoothing < 0.5:
            raise UserError(f"{option('label_smoothing')} must be in [0, 0.5), got {self.dpo.label_smoothing}")
        if self.dpo.loss_type == "ipo" and self.dpo.label_smoothing != 0:
            raise UserError(f"{option('label_smoothing')} applies to {option('loss_type', 'sigmoid')} only, not ipo")


@dataclass
class IOArgs:
    data: str = ""
    """Input rows (.jsonl, .json, .parquet or a datasets folder)."""
    output: str = ""
    """Output file: JSONL rows (generate, score), or a JSON of metrics with the samples in FILE.samples.jsonl (eval)."""
    batch_size: int = options.batch_size(16)
    seed: int = options.seed()
    cpu: bool = options.cpu()
    threads: int = options.threads()
    max_prompt_length: int = options.max_prompt_length()
    dist_timeout: int = options.dist_timeout()
    accel: Literal["auto", "off"] = options.accel()


def _check_sampling(io: IOArgs, generation: GenerationArgs) -> None:
    positive(batch_size=io.batch_size, temperature=generation.temperature, max_new_tokens=generation.max_new_tokens)
    at_least(0, threads=io.threads)


@dataclass
class SamplesArgs:
    num_samples: int = 1
    """Responses sampled per prompt: 1 writes a "response" field; K > 1 writes "responses", a list of K (the
    candidates `rlhfkit label` shows people to compare)."""


@dataclass
class GenerateConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output")
    model: ModelArgs = field(default_factory=ModelArgs)
    io: IOArgs = field(default_factory=IOArgs)
    generation: GenerationArgs = field(default_factory=GenerationArgs)
    samples: SamplesArgs = field(default_factory=SamplesArgs)

    def check(self) -> None:
        _check_sampling(self.io, self.generation)
        positive(num_samples=self.samples.num_samples)


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
        positive(batch_size=self.io.batch_size)
        at_least(0, threads=self.io.threads)


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
    samples_per_prompt: int = 1
    """Replies sampled per prompt. With 2 or more, and both --reward-model and --gold-judge, the output adds the
    reward model's agreement with the judge on pairs of the policy's own replies, and best-of-N headroom (N
    these samples): the judge's score of the reply the reward model picks, of the judge's own pick and of a
    random one."""
    pairs: str = ""
    """Held-out preference pairs (prompt, chosen, rejected) to measure the reward model on (with
    --reward-model): its accuracy on their labels and, with --gold-judge, its agreement with the judge's ranking
    of each pair and the judge's own accuracy on the labels."""


@dataclass
class EvalConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output")
    model: ModelArgs = field(default_factory=ModelArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)
    io: IOArgs = field(default_factory=IOArgs)
    generation: GenerationArgs = field(default_factory=GenerationArgs)

    def check(self) -> None:
        _check_sampling(self.io, self.generation)
        at_least(0, num_prompts=self.eval.num_prompts)
        at_least(1, samples_per_prompt=self.eval.samples_per_prompt)
        if self.eval.pairs and not self.eval.reward_model:
            raise UserError(f"{option('pairs')} measures a reward model: give {option('reward_model')} too")


@dataclass
class MergeConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ("adapter", "output_dir")
    adapter: str = ""
    """A LoRA adapter folder (adapter_config.json + adapter_model.safetensors), e.g. a run's OUT with
    --save-merged false, or OUT/adapter of any LoRA run."""
    output_dir: str = ""
    """Where the merged model (Hugging Face format, loadable by every command) and its tokenizer go; the
    adapter is kept under OUT/adapter/ as after training."""
    model: str = ""
    """The base model the adapter was trained on; empty: the folder the adapter's adapter_config.json names."""
    trust_remote_code: bool = options.trust_remote_code()
    threads: int = options.threads()

    def check(self) -> None:
        at_least(0, threads=self.threads)


@dataclass
class DemoConfig:
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    output_dir: str = "runs/demo"
    """Where the data, every stage's model, report.md, summary.json and the plots go."""
    task: Literal["support", "arithmetic", "tools"] = "support"
    """support: customer-support replies, SFT -> reward model -> PPO (with and without KL) -> DPO, judged by a hidden
    gold judge; arithmetic: sums with a checkable answer, SFT -> GRPO on the exact-answer reward; tools: sums too long
    to do without an add tool, SFT on conversations -> GRPO with the tool on the exact-answer reward."""
    seed: int = options.seed(0)
    model: str = ""
    """A pretrained causal LM (a Hugging Face folder or a .gguf file) to run the support task on instead of the
    built-in small model: its chat template formats the prompts, the stages are sized for it (LoRA on the
    policy stages above 50M parameters), and --arch / --size are not used."""
    arch: Arch = "gpt2"
    """Architecture of the small model the demo trains."""
    size: ModelSize = "tiny"
    """Model size: with the support task's vocabulary, tiny has 0.23M parameters (gpt2) or 0.26M (llama), small
    7.4M (gpt2) or 9.2M (llama); small takes much longer to run (docs/demo.md has the times)."""
    quick: bool = False
    """A few steps per stage: checks the wiring in seconds; the numbers mean nothing."""
    kl_ablation: bool | None = None
    """support task: also run PPO without the KL penalty (beta = 0), which shows the reward model
    over-optimised. Default: on for the built-in model, off with --model (where it is one more PPO run)."""
    gold_reward: bool | None = None
    """support task: also run PPO with the gold judge itself as its reward instead of the reward model, every
    other setting PPO's (its value model too): what RL reaches at the plan's budget when the reward is right,
    shown beside the learned reward model's run. Default: on for the built-in model, off with --model (one more
    PPO run)."""
    resume: bool = False
    """Continue a demo that stopped, in the same --output-dir with the same options: the stages it finished
    (stages.json) are kept, the others run again, iterated PPO from its last finished round."""
    progress: bool = True
    """Show progress bars of the stages."""
    threads: int = 1
    """torch CPU threads of each stage; 0: torch's default, one per core. With a core to spare (at least twice
    these threads) the support task runs two stages at once, one in a child process, and the stages that run
    alone (SFT, the evaluation, online DPO when the beta = 0 run is off) take both stages' threads."""
    accel: Literal["auto", "off"] = options.accel()

    def check(self) -> None:
        at_least(0, threads=self.threads)
