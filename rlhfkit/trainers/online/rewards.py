"""Rewards of online RL, as one protocol: a reward model, a Python function, a built-in task's judge, or a
weighted sum of several.

A reward component takes the batch's prompts, completions (text and token ids) and the prompt rows' other
columns, and returns two ``[B]`` tensors: its raw score (what it reports: logged as ``reward/<name>``) and
the value that enters the training reward (the same, except for a reward model, whose scores are
normalised and may be made conservative). ``NaN`` marks a row the component does not apply to (a
function's ``None``).

``Rewards`` sums the components with their weights over the rows where they apply; a row where none
applies is not valid: its advantage is set to 0. The sum then gets the missing-EOS penalty and the clip.
Python functions have TRL's signature, so its users' functions work unchanged::

    def reward(prompts: list, completions: list[str], **kwargs) -> list[float | None]: ...

with ``kwargs`` holding each extra column of the prompt rows as a list aligned with ``prompts`` (one entry
per completion) and ``completion_ids`` (the sampled token ids).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from rlhfkit.config.online import ENSEMBLE_MODE_ALIASES, OnlineRewardArgs
from rlhfkit.errors import UserError, option
from rlhfkit.models.reward import RewardScorer
from rlhfkit.ops import ensemble_reward
from rlhfkit.userfiles import load_object, replayed_callable


@dataclass
class RewardBatch:
    """B completions and what a reward may read about them (every list has B entries).

    prompts: the prompt of each completion (a string or a message list), repeated for the G completions of
        a prompt; completions: decoded texts; completion_ids: sampled token ids (EOS included when emitted);
    finished: False for a completion cut off at --max-new-tokens; columns: the prompt rows' other fields;
    rows: the 0-based index of each completion's prompt row in the data file (for error messages).
    A multi-turn rollout's completion is the conversation's last reply and its prompt the conversation before
    it; messages: each whole conversation (passed to reward functions as ``messages``); env_rewards: the sum
    of the environment's rewards of each (NaN where it gave none).
    """

    prompts: list
    completions: list[str]
    completion_ids: list[list[int]]
    finished: list[bool]
    columns: dict[str, list] = field(default_factory=dict)
    rows: list[int] = field(default_factory=list)
    messages: list[list[dict]] | None = None
    env_rewards: list[float] | None = None


@dataclass
class RewardOutput:
    """total: ``[B]`` the reward the update uses (weighted, penalised, clipped; 0 on invalid rows);
    score: ``[B]`` the weighted sum of the components' raw scores (``reward/score``; NaN on invalid rows);
    components: name -> ``[B]`` raw score of each component (NaN where it does not apply);
    valid: ``[B]`` bool, False where no component applies."""

    total: torch.Tensor
    score: torch.Tensor
    components: dict[str, torch.Tensor]
    valid: torch.Tensor


class Reward(Protocol):
    """A reward component: ``name`` (logged as ``reward/<name>``), and a call on a batch returning
    ``(raw [B], used [B])`` float tensors, NaN where it does not apply (when ``abstains``; otherwise a NaN is
    a failure that makes the step skip its update)."""

    name: str
    abstains: bool

    def __call__(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor]: ...


class RewardModelReward:
    """A reward model (or an ensemble) scoring prompt + completion; what enters the training reward is, for an
    ensemble, the objective ``--ensemble-mode`` names (``ops.ensemble_reward``: the mean, the worst member, or
    mean − k·std), standardised with the statistics saved beside the reward model (``--normalize-reward``)."""

    name = "reward_model"
    abstains = False  # a NaN score is a numerical failure, not "does not apply"

    def __init__(self, scorer: RewardScorer, args: OnlineRewardArgs):
        self.scorer, self.args = scorer, args

    def __call__(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.scorer.score(batch.prompts, batch.completions, finished=batch.finished)
        raw = out.mean.float().cpu()
        members = getattr(out, "members", None)  # None: one reward model, whose score every objective is
        objective = ENSEMBLE_MODE_ALIASES.get(self.args.ensemble_mode, self.args.ensemble_mode)
        used = out.mean if members is None else ensemble_reward(members, objective, self.scorer.conservative_k)
        used = used.float().cpu()
        stats = self.scorer.stats
        if self.args.normalize_reward and stats:
            used = (used - stats["mean"]) / max(stats["std"], 1e-6)
        return raw, used


class FunctionReward:
    """A Python function with TRL's signature; ``None`` in its result marks a row it does not apply to.

    A function that raises, returns the wrong number of values, or a value that is not a finite number (or
    None) stops the run with one line naming the function and the data row."""

    abstains = True  # None (NaN) marks a row the function does not apply to

    def __init__(self, fn: Callable, name: str | None = None, data_path: str = "the data"):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.data_path = data_path

    def _where(self, batch: RewardBatch, i: int) -> str:
        row = batch.rows[i] + 1 if batch.rows else i + 1
        return f"{self.data_path}: row {row}"

    def __call__(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(batch.completions)
        try:
            extra = {"messages": batch.messages} if batch.messages is not None else {}
            values = self.fn(
                batch.prompts, batch.completions, completion_ids=batch.completion_ids, **extra, **batch.columns
            )
        except Exception as exc:  # the user's code: any failure becomes one line naming it and the rows
            first = sorted(set(batch.rows))[:3] if batch.rows else []
            rows = ", ".join(str(r + 1) for r in first) + (", ..." if len(set(batch.rows)) > 3 else "")
            message = str(exc).splitlines()[0] if str(exc) else ""
            raise UserError(
                f"{self.data_path}: rows {rows}: reward function '{self.name}' raised {type(exc).__name__}"
                + (f": {message}" if message else "")
            ) from None
        if isinstance(values, torch.Tensor):
            values = values.tolist()
        if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
            raise UserError(
                f"reward function '{self.name}' returned {type(values).__name__}, not a list of {n} numbers"
            )
        if len(values) != n:
            raise UserError(f"reward function '{self.name}' returned {len(values)} values for {n} completions")
        out = []
        for i, value in enumerate(values):
            if value is None:
                out.append(math.nan)
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise UserError(
                    f"{self._where(batch, i)}: reward function '{self.name}' returned {value!r}, "
                    "not a finite number or None"
                )
            out.append(float(value))
        raw = torch.tensor(out, dtype=torch.float32)
        return raw, raw.clone()


class EnvReward:
    """The environment's rewards of a multi-turn rollout, summed over each episode; an episode without any
    is a row this reward does not apply to."""

    name = "env"
    abstains = True

    def __call__(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        raw = torch.tensor(batch.env_rewards or [math.nan] * len(batch.completions), dtype=torch.float32)
        return raw, raw.clone()


class Rewards:
    """The weighted sum of reward components, with the missing-EOS penalty and the clip applied to it."""

    def __init__(self, components: list[Reward], weights: list[float] | None, args: OnlineRewardArgs):
        names = [c.name for c in components]
        duplicated = {n for n in names if names.count(n) > 1}
        if duplicated:
            raise UserError(f"two rewards are named {', '.join(sorted(duplicated))}: give the functions other names")
        self.components = components
        self.weights = list(weights) if weights else [1.0] * len(components)
        self.args = args

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    @property
    def env_weight(self) -> float:
        """The weight of the environment's rewards (0 without an environment)."""
        return next((w for c, w in zip(self.components, self.weights) if isinstance(c, EnvReward)), 0.0)

    @property
    def reward_model(self) -> RewardModelReward | None:
        return next((c for c in self.components if isinstance(c, RewardModelReward)), None)

    def __call__(self, batch: RewardBatch) -> RewardOutput:
        raws, useds = zip(*(component(batch) for component in self.components))
        abstains = [c.abstains for c in self.components]
        total, valid = _weighted_sum(useds, self.weights, abstains)
        score, _ = _weighted_sum(raws, self.weights, abstains)
        total = torch.where(valid, total, 0.0)
        penalty = self.args.missing_eos_penalty
        if penalty is not None:
            cut_off = torch.tensor([not done for done in batch.finished])
            total = torch.where(cut_off, total - penalty, total)
        if self.args.reward_clip is not None:
            total = total.clamp(-self.args.reward_clip, self.args.reward_clip)
        return RewardOutput(total, score, dict(zip(self.names, raws)), valid)


def _weighted_sum(
    values: Sequence[torch.Tensor], weights: list[float], abstains: list[bool]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B] Σ_i w_i·x_i over the components that apply to a row, [B] whether any applies)``; NaN where
    none applies. A NaN of a component that cannot abstain counts as applying, so it reaches the sum and the
    step's finiteness check. One component with weight 1 passes through unchanged."""
    stacked = torch.stack(list(values))  # [K, B]
    applies = ~torch.isnan(stacked) | ~torch.tensor(abstains).unsqueeze(1)
    valid = applies.any(dim=0)
    if len(values) == 1 and weights[0] == 1.0:
        return values[0], valid
    weighted = torch.stack([w * v for w, v in zip(weights, values)])
    summed = torch.where(applies, weighted, 0.0).sum(dim=0)
    return torch.where(valid, summed, math.nan), valid


def load_function(spec: str, data_path: str = "the data") -> FunctionReward:
    """A reward from ``--reward-fn``: ``FILE.py:NAME`` (a function in a Python file), or a built-in task's
    reward: ``TASK`` (its first reward function) or ``TASK:NAME``."""
    replayed_callable("reward_fn", spec)
    location, _, name = spec.rpartition(":")
    if not location:  # no colon
        location, name = spec, ""
    if location.endswith(".py") or "/" in location:
        if not name:
            raise UserError(f"{option('reward_fn', spec)}: give the function as FILE.py:NAME")
        return FunctionReward(load_object("reward_fn", spec, Path(location), name), name, data_path)
    return _task_reward(spec, location, name, data_path)


def _task_reward(spec: str, task_name: str, name: str, data_path: str) -> FunctionReward:
    from rlhfkit.tasks import get_task

    try:
        task = get_task(task_name)
    except ValueError as exc:
        raise UserError(f"{option('reward_fn', spec)}: not FILE.py:NAME, and {exc}") from None
    functions = task.reward_functions
    if not functions:
        raise UserError(f"{option('reward_fn', spec)}: the task '{task_name}' has no reward function")
    if name and name not in functions:
        raise UserError(f"{option('reward_fn', spec)}: the task '{task_name}' has {', '.join(functions)}, not '{name}'")
    chosen = name or next(iter(functions))
    return FunctionReward(functions[chosen], f"{task_name}_{chosen}" if name else task_name, data_path)


def build_rewards(
    args: OnlineRewardArgs, data_path: str, scorer: RewardScorer | None = None, env: bool = False
) -> Rewards:
    """The rewards of a run: the reward model first (when given: ``scorer``, loaded by the caller), then each
    ``--reward-fn`` (a FILE.py:NAME or task spec, or a Python callable given through the Python API), then the
    environment's (``env``)."""
    components: list[Any] = []
    if scorer is not None:
        components.append(RewardModelReward(scorer, args))
    for fn in args.reward_fn:
        if isinstance(fn, str):
            components.append(load_function(fn, data_path))
        else:
            components.append(FunctionReward(fn, data_path=data_path))
    if env:
        components.append(EnvReward())
    return Rewards(components, args.reward_weights, args)
