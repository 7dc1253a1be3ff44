"""A registry of advantage estimators with one calling convention, so a trainer picks one by name.

Every estimator is called as

    advantages, returns = ADVANTAGE_ESTIMATORS[name](token_rewards, mask, config, values=None)

    token_rewards  ``[B, T]``  per-token rewards: the sequence score at its last real token, minus
                               β·KL_t if the KL is in the reward (:func:`rlhfkit.ops.per_token_rewards`)
    mask           ``[B, T]``  1 on real response tokens, 0 on padding
    config         :class:`AdvantageConfig`, the hyper-parameters (each estimator reads the ones it needs) and
                               the batch's prompt groups (``group_ids`` ``[B]``, or contiguous ``group_size``)
    values         ``[B, T]``  value-head predictions; required where ``needs_critic`` is True, else unused
    advantages     ``[B, T]``  0 on padding
    returns        ``[B, T]``  the value-head target for critic estimators; for critic-free ones the
                               un-normalised return each token's advantage was made from, for logging

Outcome (group) estimators read the sequence score s_b = Σ_t r_t·m_t and broadcast one advantage per
completion over its real tokens. Adding an algorithm is adding a function with
:func:`register_advantage_estimator`; its metadata (``needs_critic``, ``compares_group``) is all the trainers
and the configs read, so the new name is at once a valid ``--advantage`` choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from .advantages import gae, sequence_advantage
from .critic_free import grpo_advantages, reinforce_pp_advantages, reinforce_pp_baseline, rloo_advantages
from .stats import masked_whiten


@dataclass(frozen=True)
class AdvantageConfig:
    """Hyper-parameters of the advantage estimators; each estimator uses only its own."""

    gamma: float = 1.0
    """Discount γ ("gae", "reinforce_pp")."""
    lam: float = 0.95
    """GAE λ ("gae")."""
    group_size: int = 1
    """Completions per prompt G; without ``group_ids``, rows [k·G, (k+1)·G) share a prompt ("grpo", "rloo",
    "reinforce_pp_baseline")."""
    group_ids: Tensor | None = field(default=None, compare=False)
    """``[B]`` LongTensor: the prompt group of each row of the batch (equal ids share a prompt; any order, groups of
    any size), which the group estimators read instead of ``group_size``; None: contiguous groups of ``group_size``."""
    scale: str = "group"
    """GRPO's reward scaling: "group", "batch" or "none" ("grpo")."""
    eps: float = 1e-4
    """Added to GRPO's std ("grpo")."""


class AdvantageFn(Protocol):
    """``fn(token_rewards, mask, config, values) -> (advantages, returns)``, the shapes of the module docstring."""

    def __call__(
        self, token_rewards: Tensor, mask: Tensor, config: AdvantageConfig, values: Tensor | None
    ) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: ``fn`` and its metadata.

    ``needs_critic``: it reads a value function's predictions (the trainer then builds one, trains it on the
    returns, and whitens the advantages with --whiten-advantages). ``compares_group``: it compares the G
    completions of a prompt (it needs G >= 2, and a group whose rewards are all equal carries no signal)."""

    name: str
    fn: AdvantageFn
    needs_critic: bool = False
    compares_group: bool = False

    def __call__(
        self,
        token_rewards: Tensor,
        mask: Tensor,
        config: AdvantageConfig,
        values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        if self.needs_critic and values is None:
            raise ValueError(f"advantage estimator {self.name!r} needs values from a value head")
        return self.fn(token_rewards, mask, config, values)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(
    name: str, *, needs_critic: bool = False, compares_group: bool = False
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding ``fn(token_rewards, mask, config, values)`` to :data:`ADVANTAGE_ESTIMATORS` under
    ``name``, with its metadata (:class:`AdvantageEstimator`)."""

    def register(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(name, fn, needs_critic, compares_group)
        return fn

    return register


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; ValueError naming the known ones otherwise."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {', '.join(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name]


def _scores(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """Sequence score s_b = Σ_t r_t·m_t -> ``[B]``."""
    return torch.where(mask.bool(), token_rewards, 0.0).sum(dim=-1)


def _group_args(config: AdvantageConfig) -> dict:
    """How a group estimator is told the groups: ``group_ids`` when the batch names them, else ``group_size``."""
    if config.group_ids is not None:
        return {"group_ids": config.group_ids}
    return {"group_size": config.group_size}


def _broadcast(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` -> ``[B, T]``: the row's value on its real tokens, 0 on padding."""
    return per_sequence.unsqueeze(-1) * mask.to(per_sequence.dtype)


@register_advantage_estimator("gae", needs_critic=True)
def _gae(token_rewards: Tensor, mask: Tensor, config: AdvantageConfig, values: Tensor | None) -> tuple[Tensor, Tensor]:
    """GAE(γ, λ) (Schulman et al. 2016): :func:`rlhfkit.ops.gae`."""
    assert values is not None  # checked by AdvantageEstimator.__call__
    return gae(token_rewards, values, mask, config.gamma, config.lam)


@register_advantage_estimator("sequence", needs_critic=True)
def _sequence(
    token_rewards: Tensor, mask: Tensor, config: AdvantageConfig, values: Tensor | None
) -> tuple[Tensor, Tensor]:
    """A = Σ_t r_t − V(prompt) on every real token: :func:`rlhfkit.ops.sequence_advantage`."""
    assert values is not None  # checked by AdvantageEstimator.__call__
    return sequence_advantage(token_rewards, values, mask)


@register_advantage_estimator("grpo", compares_group=True)
def _grpo(token_rewards: Tensor, mask: Tensor, config: AdvantageConfig, values: Tensor | None) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024) on s_b: :func:`rlhfkit.ops.grpo_advantages` with ``config.scale``, ``eps``."""
    scores = _scores(token_rewards, mask)
    advantages = grpo_advantages(scores, scale=config.scale, eps=config.eps, **_group_args(config))
    return _broadcast(advantages, mask), _broadcast(scores, mask)


@register_advantage_estimator("rloo", compares_group=True)
def _rloo(token_rewards: Tensor, mask: Tensor, config: AdvantageConfig, values: Tensor | None) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024) on s_b: :func:`rlhfkit.ops.rloo_advantages`."""
    scores = _scores(token_rewards, mask)
    return _broadcast(rloo_advantages(scores, **_group_args(config)), mask), _broadcast(scores, mask)


@register_advantage_estimator("reinforce_pp")
def _reinforce_pp(
    token_rewards: Tensor, mask: Tensor, config: AdvantageConfig, values: Tensor | None
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): whitened discounted returns, :func:`rlhfkit.ops.reinforce_pp_advantages`."""
    return reinforce_pp_advantages(token_rewards, mask, config.gamma)


@register_advantage_estimator("reinforce_pp_baseline", compares_group=True)
def _reinforce_pp_baseline(
    token_rewards: Tensor, mask: Tensor, config: AdvantageConfig, values: Tensor | None
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu 2025): s_b − mean_g broadcast over real tokens, then whitened over the batch."""
    scores = _scores(token_rewards, mask)
    centred = _broadcast(reinforce_pp_baseline(scores, **_group_args(config)), mask)
    return masked_whiten(centred, mask) * mask.to(centred.dtype), _broadcast(scores, mask)
