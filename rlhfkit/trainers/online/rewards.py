"""Rewards of online RL, as one protocol: a reward model, a Python function, a built-in task's judge, or a
weighted sum of several.

A reward component takes the batch's prompts, completions (text and token ids) and the prompt rows' other
columns, and returns two ``[B]`` tensors: its raw score (what it reports: logged as ``reward/<name>``) and
the value that enters the training reward (the same, except for a reward model, whose scores are
normalised and may be made conservative). ``NaN`` marks a row the component does not apply to (a
function's ``None``).

``Rewards`` sums the components with their weights over the rows where they apply; a row where none
applies is not valid: its advantage is set to 0. The sum then gets the missing-EOS penalty and the clip.
Python functions are called as TRL's GRPOTrainer calls them, so its users' functions work unchanged::

    def reward(prompts, completions, completion_ids, **kwargs) -> list[float | None]: ...

every argument a keyword and a list with one entry per completion: ``prompts`` (a string, or for a chat
prompt its message list), ``completions`` (a string for a string prompt, else a message list:
``[{"role": "assistant", "content": ...}]``), ``completion_ids`` (the sampled token ids), each other
column of the prompt rows by its name, and ``trainer_state`` (``global_step``, ``max_steps``). In a
multi-turn rollout ``prompts`` are the messages the conversation opened with and ``completions`` every
message after them (replies, tool results, the environment's messages), ``completion_ids`` every token
after the prompt's. An ``async def`` function is awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from rlhfkit.config.online import ENSEMBLE_MODE_ALIASES, OnlineRewardArgs
from rlhfkit.data.readers import row_location
from rlhfkit.errors import UserError, option
from rlhfkit.models.reward import RewardScorer
from rlhfkit.ops import ensemble_reward
from rlhfkit.tasks import get_task
from rlhfkit.userfiles import load_object, replayed_callable


@dataclass
class TrainerState:
    """What a reward function reads of the run as ``trainer_state`` (the fields of TRL's ``TrainerState``
    that shape rewards over training): global_step, the updates done before this batch; max_steps."""

    global_step: int = 0
    max_steps: int = 0


@dataclass
class RewardBatch:
    """B completions and what a reward may read about them (every list has B entries).

    prompts: the prompt of each completion (a string or a message list), repeated for the G completions of
        a prompt; completions: decoded texts; completion_ids: sampled token ids (EOS included when emitted);
    finished: False for a completion cut off at --max-new-tokens; columns: the prompt rows' other fields;
    rows: the 0-based index of each completion's prompt row in the data file (for error messages).
    A multi-turn rollout's completion is the conversation's last reply and its prompt the conversation before
    it (what a reward model scores); messages: each whole conversation; openings: how many of its first
    messages it opened with (the row's prompt, or the environment's opening); conversation_ids: every token
    after the opening's; env_rewards: the sum of the environment's rewards of each (NaN where it gave none).
    trainer_state: the run's progress, set by ``Rewards``.
    """

    prompts: list
    completions: list[str]
    completion_ids: list[list[int]]
    finished: list[bool]
    columns: dict[str, list] = field(default_factory=dict)
    rows: list[int] = field(default_factory=list)
    messages: list[list[dict]] | None = None
    env_rewards: list[float] | None = None
    openings: list[int] | None = None
    conversation_ids: list[list[int]] | None = None
    trainer_state: TrainerState = field(default_factory=TrainerState)

    def function_arguments(self) -> dict[str, Any]:
        """The keyword arguments of a reward function, as TRL's GRPOTrainer passes them: the prompt rows'
        columns, then ``prompts``, ``completions`` and ``completion_ids`` (chat prompts give message-list
        completions; a multi-turn rollout gives its opening and every message after it), ``trainer_state``."""
        if self.messages is not None:
            openings = self.openings or [len(m) - 1 for m in self.messages]
            prompts = [m[:k] for m, k in zip(self.messages, openings)]
            completions: list = [m[k:] for m, k in zip(self.messages, openings)]
            ids = self.conversation_ids if self.conversation_ids is not None else self.completion_ids
        else:
            prompts = self.prompts
            completions = [
                c if isinstance(p, str) else [{"role": "assistant", "content": c}]
                for p, c in zip(self.prompts, self.completions)
            ]
            ids = self.completion_ids
        return {
            **self.columns,
            "prompts": prompts,
            "completions": completions,
            "completion_ids": ids,
            "trainer_state": self.trainer_state,
        }


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
    """A Python function called as TRL calls it (``RewardBatch.function_arguments``); ``None`` in its result
    marks a row it does not apply to.

    A function that raises, returns the wrong number of values, or a value that is not a finite number (or
    None) stops the run with one line naming the function and the data row."""

    abstains = True  # None (NaN) marks a row the function does not apply to

    def __init__(self, fn: Callable, name: str | None = None, data_path: str = "the data"):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.data_path = data_path

    def _where(self, batch: RewardBatch, i: int) -> str:
        return row_location(self.data_path, batch.rows[i] if batch.rows else i)

    def __call__(self, batch: RewardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(batch.completions)
        try:
            values = self.fn(**batch.function_arguments())
            if inspect.isawaitable(values):
                values = asyncio.run(_awaited(values))
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


async def _awaited(result):
    return await result


PASSED = ("prompts", "completions", "completion_ids", "trainer_state")  # besides the prompt rows' columns


def check_signature(fn: Callable, name: str, columns: Iterable[str], data_path: str = "the data") -> None:
    """Raise a UserError unless ``fn`` takes the keyword arguments a reward function is called with
    (``PASSED`` and ``columns``, the prompt rows' other fields): one line naming the function, where it is
    defined, and what it lacks. A callable without a readable signature (a builtin) is left to its call."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    columns = [c for c in dict.fromkeys(columns) if c not in PASSED]
    passed = [*PASSED, *columns]
    target = fn if inspect.isroutine(fn) else type(fn).__call__  # a callable object: its __call__
    code = getattr(inspect.unwrap(target), "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}: " if code is not None else ""
    gets = f"it is called with {', '.join(PASSED)} and the columns of {data_path} ({', '.join(columns) or 'none'})"
    for p in params:
        if p.default is not p.empty:
            continue
        if p.kind is p.POSITIONAL_ONLY:
            raise UserError(
                f"{where}reward function '{name}' has a positional-only parameter '{p.name}': reward functions "
                f"get keyword arguments only ({gets})"
            )
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in passed:
            raise UserError(f"{where}reward function '{name}' needs '{p.name}', which it is not given: {gets}")
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        unexpected = [n for n in passed if n not in {p.name for p in params}]
        if unexpected:
            raise UserError(
                f"{where}reward function '{name}' has no **kwargs but is also called with "
                f"{', '.join(unexpected)}: add **kwargs to its parameters"
            )


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
        self.state = TrainerState()  # what reward functions read as trainer_state; the run sets it each step

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
        batch.trainer_state = self.state
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
    args: OnlineRewardArgs,
    data_path: str,
    scorer: RewardScorer | None = None,
    env: bool = False,
    columns: Iterable[str] = (),
) -> Rewards:
    """The rewards of a run: the reward model first (when given: ``scorer``, loaded by the caller), then each
    ``--reward-fn`` (a FILE.py:NAME or task spec, or a Python callable given through the Python API), its
    signature checked against the keyword arguments it will get (``columns``: the prompt rows' other fields),
    then the environment's (``env``)."""
    components: list[Any] = []
    if scorer is not None:
        components.append(RewardModelReward(scorer, args))
    columns = list(columns)
    for fn in args.reward_fn:
        function = load_function(fn, data_path) if isinstance(fn, str) else FunctionReward(fn, data_path=data_path)
        check_signature(function.fn, function.name, columns, data_path)
        components.append(function)
    if env:
        components.append(EnvReward())
    return Rewards(components, args.reward_weights, args)
