"""Options of `rlhfkit iterate`: PPO's options (one round's PPO), the reward model's, and the loop's own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from rlhfkit.config.checks import at_least, positive
from rlhfkit.config.commands import RewardArgs
from rlhfkit.config.online import PPOConfig
from rlhfkit.config.pages import ServeArgs
from rlhfkit.errors import UserError, option
from rlhfkit.tasks import rater_tasks

HUMAN = "human"
MODEL = "model:"  # --judge model:PATH, a local causal LM as the judge
HUMAN_AND_MODEL = "human+model:"  # people label a share of each round, the model the rest


def needs_people(judge) -> bool:
    """Whether the judge spec sends pairs to the labelling page (all of them, or a share)."""
    return isinstance(judge, str) and (judge == HUMAN or judge.startswith(HUMAN_AND_MODEL))


@dataclass
class IterateArgs:
    judge: str = ""
    """Who labels each round's pairs: FILE.py:NAME (in Python also the function itself), a function
    prefer(prompts, completions, **kwargs) -> list[int] where completions[i] is the pair [a, b] and the answer
    0 (a is better), 1 (b is better) or -1 (no preference: the pair is dropped); 'human': the pairs go to a
    labelling page (as `rlhfkit label`'s) and the round waits for the labels; model:PATH: a local causal LM
    (a folder or .gguf) judges, as `rlhfkit judge` does (both orders asked, a pair whose answer flips is dropped);
    human+model:PATH: people label --human-share of each round's pairs on the page, the model the rest, and the
    round records the model's agreement with people on their share; or a built-in task's simulated raters by
    name ('support': the noisy rule that labelled the support task's pairs, seeded with --seed)."""
    prefs: str = ""
    """Preference pairs (prompt, chosen, rejected) to train the first reward model on (from --model) when no
    --reward-model is given; kept in every round's reward-model data."""
    algorithm: Literal["ppo", "dpo"] = "ppo"
    """How the policy learns from each round's labels: ppo (the reward model continues on all pairs so far, then
    PPO continues against it) or dpo (online DPO: DPO continues from the last policy on the round's new pairs,
    the reference staying --model; no reward model). With --prefs, dpo first trains on them from --model; the
    reward model's and PPO's own options (--rm-*, --max-steps, --kl-coef, ...) are then not used."""
    dpo_beta: float = 0.1
    """With --algorithm dpo: DPO's beta."""
    dpo_epochs: float = 2.0
    """With --algorithm dpo: passes over each round's new pairs (and over --prefs first), at --learning-rate."""
    rounds: int = 3
    """Rounds of (pairs sampled from the policy -> labels -> reward model updated -> PPO continued)."""
    carry_optimizer: bool = False
    """Each round's PPO (or online DPO) continues the last round's AdamW moments and one learning-rate schedule
    over every round's steps, as a single run whose labels arrive in rounds; false: each round starts both
    afresh (its rate decaying to 0 within the round)."""
    pairs_per_round: int = 128
    """Prompts of --data sampled twice by the current policy each round; each gives one pair to label."""
    rm_steps: int = 50
    """Reward-model steps per round, over all pairs so far (--prefs and every round's)."""
    rm_initial_steps: int = 0
    """Steps of the first reward model on --prefs (0: --rm-steps)."""
    rm_learning_rate: float = 0.0
    """Peak learning rate of the reward model's training and updates; 0: the rate the reward model was trained
    at (read from the config.yaml `rlhfkit rm` saves beside it), or `rlhfkit rm`'s default when it has none. Its
    batch size and LoRA settings are carried over the same way."""
    rm_batch_size: int = 0
    """Pairs per reward-model step; 0: the batch size the reward model was trained with (else 8)."""
    rm_lora_r: int = 0
    """LoRA rank of the reward model's training and updates (with --lora-alpha, --lora-dropout and
    --lora-target-modules; its score head trains in full); 0: as the reward model was trained (in full for the
    first one from --model)."""
    rm_holdout: float = 0.2
    """Share of each round's new labelled pairs that the round's reward-model update does not train on: its
    accuracy on them before and after the update shows whether the update generalised (they join the training
    pairs from the next round on)."""
    rm_trust: float = 0.55
    """When the reward model's accuracy on a round's new pairs, before its update, is under this (from round 2
    on), the policy has outrun it (its replies are where the reward model no longer ranks them): the KL
    coefficient doubles from that round's PPO on, the adaptive KL controller's answer at the scale of a round
    (Ziegler et al. 2019). 0: never."""
    collapse_similar: float = 0.5
    """The policy has collapsed when at least this share of its pairs (its two replies to a prompt) are the same
    or nearly so, more than the starting policy's (0: never checked): the judge cannot tell such replies apart.
    A collapsed policy's round then pairs each of its replies with one of the last policy that had not
    collapsed, so the labels (and the reward model) learn what the collapsed replies are worth."""
    min_labels: int = 0
    """With --judge human: close a round once this many pairs are labelled (0: when every pair is labelled or
    skipped by everyone)."""
    annotators: str = ""
    """With --judge human: comma-separated annotator names, each given a private URL that stays the same in
    every round (default: one annotator named 'annotator')."""
    labels_per_item: int = 1
    """With --judge human: different annotators who label each pair (several: a majority vote decides)."""
    guidelines: str = ""
    """With --judge human: Markdown file of labelling guidelines, one click away on the page."""
    poll_seconds: float = 5.0
    """With --judge human: how often a waiting round checks for new labels."""
    judge_principles: str = ""
    """With --judge model:PATH or human+model:PATH: text file of principles, one per line, that the model judges
    by (empty: a short helpful, honest and harmless default)."""
    human_share: float = 0.25
    """With --judge human+model:PATH: share of each round's pairs that people label (drawn at random); the model
    judges every pair, and its labels are used for the others."""


@dataclass
class IterateConfig(PPOConfig):
    """Iterated RLHF (Bai et al. 2022; Ouyang et al. 2022): each round samples two replies per prompt from the
    current policy, has --judge (a Python function, or people on the labelling page) say which is better,
    measures the reward model's accuracy on these new on-policy pairs, continues the reward model on all pairs
    so far, and continues PPO from the last round's policy and value model; the KL reference stays --model.
    With --algorithm dpo, online DPO instead: DPO continues on each round's pairs, no reward model.
    Writes OUT/round-K/{pairs.jsonl, rm/, ppo/ or dpo/}, OUT/final/ (the last policy) and OUT/summary.json.
    --max-steps is PPO's steps per round; --resume continues an interrupted run at its round (labels kept)."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "data", "output_dir", "judge")
    algorithm: ClassVar[str] = "iterate"
    iterate: IterateArgs = field(default_factory=IterateArgs)
    rm_reward: RewardArgs = field(default_factory=RewardArgs)
    serve: ServeArgs = field(default_factory=ServeArgs)

    def check(self) -> None:
        # One round's PPO gets its reward model from the loop: check PPO's options as that round sees them.
        placeholder = self.reward.reward_model or "round reward model"
        ppo = PPOConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PPOConfig)})
        ppo.reward = dataclasses.replace(self.reward, reward_model=placeholder)
        ppo.check()
        it = self.iterate
        positive(
            rounds=it.rounds,
            pairs_per_round=it.pairs_per_round,
            dpo_beta=it.dpo_beta,
            dpo_epochs=it.dpo_epochs,
            labels_per_item=it.labels_per_item,
            poll_seconds=it.poll_seconds,
            ensemble=self.rm_reward.ensemble,
        )
        at_least(
            0,
            rm_steps=it.rm_steps,
            rm_initial_steps=it.rm_initial_steps,
            min_labels=it.min_labels,
            rm_learning_rate=it.rm_learning_rate,
            rm_batch_size=it.rm_batch_size,
            rm_lora_r=it.rm_lora_r,
        )
        if not 0 <= it.rm_trust <= 1:
            raise UserError(f"{option('rm_trust')} must be in [0, 1], got {it.rm_trust}")
        if not 0 <= it.collapse_similar <= 1:
            raise UserError(f"{option('collapse_similar')} must be in [0, 1], got {it.collapse_similar}")
        if not 0 <= it.rm_holdout < 1:
            raise UserError(f"{option('rm_holdout')} must be in [0, 1), got {it.rm_holdout}")
        if self.optim.max_steps <= 0:
            raise UserError(f"{option('max_steps')} (PPO steps per round) must be > 0")
        if self.optim.optimizer_state or self.optim.schedule_steps:
            raise UserError(
                f"{option('optimizer_state')} and {option('schedule_steps')} are set by the loop for each round: "
                f"give {option('carry_optimizer', True)} to carry the optimizer from round to round"
            )
        if it.algorithm == "ppo" and not self.reward.reward_model and not it.prefs:
            raise UserError(
                f"give {option('reward_model')} (the reward model to start from) or {option('prefs')} (pairs to "
                "train it on first)"
            )
        if not callable(it.judge) and it.judge != HUMAN and ":" not in it.judge and it.judge not in rater_tasks():
            names = ", ".join(f"'{n}'" for n in rater_tasks())
            raise UserError(
                f"{option('judge', it.judge)}: give FILE.py:NAME, 'human', or a task's raters ({names}), or a model "
                "judge: model:PATH or human+model:PATH"
            )
        for prefix in (MODEL, HUMAN_AND_MODEL):
            if isinstance(it.judge, str) and it.judge.startswith(prefix) and not it.judge[len(prefix) :]:
                raise UserError(f"{option('judge', it.judge)}: give the judge model's folder or .gguf file after it")
        if not 0 < it.human_share <= 1:
            raise UserError(f"{option('human_share')} must be in (0, 1], got {it.human_share}")
        if it.judge_principles and not Path(it.judge_principles).is_file():
            raise UserError(f"{it.judge_principles}: {option('judge_principles')} file does not exist")
        if it.guidelines and not Path(it.guidelines).is_file():
            raise UserError(f"{it.guidelines}: {option('guidelines')} file does not exist")
        if not 0 <= self.serve.port <= 65535:
            raise UserError(f"{option('port')} must be in 0..65535, got {self.serve.port}")
