"""Losses: PPO's whole loss (``ppo_loss``) from its policy losses (a registry: token ratio, sequence ratio), value
loss, entropy and KL terms; Bradley–Terry reward model; DPO / IPO.

Shapes: ``[B, T]`` = batch × response tokens; ``mask`` is 1 on real tokens, 0 on padding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from .aggregation import aggregate_loss
from .engine_mismatch import truncated_importance_weights
from .kl import kl_penalty
from .stats import masked_mean


class PolicyLossFn(Protocol):
    """``fn(logprobs, old_logprobs, advantages, mask, clip_eps, *, clip_eps_high) -> (per_token [B, T], stats)``,
    ``stats`` holding the detached ``clipfrac`` and ``approx_kl``."""

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        *,
        clip_eps_high: float | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


POLICY_LOSSES: dict[str, PolicyLossFn] = {}
"""The policy losses by name (``--importance-ratio``); :func:`register_policy_loss` adds one."""


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a per-token policy loss (:class:`PolicyLossFn`) to :data:`POLICY_LOSSES` as ``name``."""

    def register(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return register


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; ValueError naming the known ones otherwise."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; choose one of {', '.join(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def _clip_bounds(clip_eps: float, clip_eps_high: float | None) -> tuple[float, float]:
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if clip_eps < 0 or high < 0:
        raise ValueError(f"clip_eps and clip_eps_high must be >= 0, got {clip_eps} and {high}")
    return 1.0 - clip_eps, 1.0 + high


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token max(−A·ρ, −A·clip(ρ, low, high)) (0 on padding) and where the clipped term won, ``[B, T]``."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, low, high)
    # torch.where rather than ·mask: padding may hold any log-prob, and inf·0 would be NaN.
    per_token = torch.where(mask.bool(), torch.maximum(unclipped, clipped), 0.0)
    return per_token, clipped > unclipped


@register_policy_loss("token")
def ppo_policy_loss_per_token(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO surrogate per token, unreduced -> ``(per_token_loss [B, T], stats)``.

        ρ_t = exp(lp_t − lp_old_t)
        l_t = max(−A_t·ρ_t, −A_t·clip(ρ_t, 1−ε_low, 1+ε_high))     (0 on padding)

    PPO (Schulman et al. 2017, eq. 7) has ε_low = ε_high = ``clip_eps``; clip-higher (DAPO, Yu et al.
    2025) sets ``clip_eps_high`` > ``clip_eps`` so low-probability tokens with A > 0 can still grow.
    ``clip_eps_high=None`` means ``clip_eps``. ``logprobs`` (carries the gradient), ``old_logprobs``,
    ``advantages``, ``mask``: ``[B, T]``. Reduce ``l`` with :func:`rlhfkit.ops.aggregate_loss`.
    Detached stats, as in :func:`ppo_policy_loss`: ``clipfrac`` and ``approx_kl``.
    """
    low, high = _clip_bounds(clip_eps, clip_eps_high)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    per_token, clipped = _clipped_surrogate(ratio, advantages, mask, low, high)
    stats = {
        "clipfrac": masked_mean(clipped.to(ratio.dtype), mask).detach(),
        "approx_kl": masked_mean(0.5 * log_ratio**2, mask).detach(),
    }
    return per_token, stats


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate objective of PPO (Schulman et al. 2017, eq. 7), as a loss -> ``(scalar, stats)``.

        ρ_t = exp(lp_t − lp_old_t)
        loss = masked mean of max(−A_t·ρ_t, −A_t·clip(ρ_t, 1−ε, 1+ε_high))

    ``clip_eps_high`` (clip-higher, DAPO, Yu et al. 2025) defaults to ε = ``clip_eps``.
    ``logprobs`` (current policy, carries the gradient), ``old_logprobs`` (rollout policy),
    ``advantages``, ``mask``: ``[B, T]``. Detached stats:
    ``clipfrac`` = masked fraction of tokens where the clipped term is the larger one (no gradient);
    ``approx_kl`` = masked mean of ½(lp − lp_old)², the k2 estimate of KL to the rollout policy.
    Other reductions: :func:`ppo_policy_loss_per_token` with :func:`rlhfkit.ops.aggregate_loss`.
    """
    per_token, stats = ppo_policy_loss_per_token(
        logprobs, old_logprobs, advantages, mask, clip_eps, clip_eps_high=clip_eps_high
    )
    return masked_mean(per_token, mask), stats


@register_policy_loss("sequence")
def sequence_ratio_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    *,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate with one importance ratio per sequence -> ``(per_token_loss [B, T], stats)``.

        ρ = exp(Σ_t (lp_t − lp_old_t)·m_t)                        one ratio per row, ``[B]``
        l_t = max(−A_t·ρ, −A_t·clip(ρ, 1−ε_low, 1+ε_high))         (0 on padding)

    The whole completion is one action, as in RLOO (Ahmadian et al. 2024) and TRL's RLOO trainer:
    with a sequence advantage A (``[B]``, or ``[B, T]`` constant along each row) every real token of a
    row holds that row's loss, so ``aggregate_loss(l, mask, "seq-mean-token-mean")`` is the mean over
    sequences of max(−A·ρ, −A·clip(ρ)). ``logprobs``, ``old_logprobs``, ``mask``: ``[B, T]``.
    ``clip_eps_high=None`` means ``clip_eps``. The ratio of a long sequence can overflow to inf; the
    clipped term then bounds the loss only where A > 0. Detached stats:
    ``clipfrac`` = fraction of rows with at least one real token whose clipped term is the larger;
    ``approx_kl`` = masked mean over tokens of ½(lp − lp_old)².
    """
    low, high = _clip_bounds(clip_eps, clip_eps_high)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B, 1], broadcast over tokens
    log_ratio = logprobs - old_logprobs
    token_mask = mask.bool()
    seq_log_ratio = torch.where(token_mask, log_ratio, 0.0).sum(dim=-1, keepdim=True)  # [B, 1]
    ratio = torch.exp(seq_log_ratio).expand_as(logprobs)
    per_token, clipped = _clipped_surrogate(ratio, advantages.expand_as(logprobs), mask, low, high)
    has_tokens = token_mask.any(dim=-1)  # [B]
    row_clipped = (clipped & token_mask).any(dim=-1)  # [B]
    stats = {
        "clipfrac": masked_mean(row_clipped.to(logprobs.dtype), has_tokens).detach(),
        "approx_kl": masked_mean(0.5 * log_ratio**2, mask).detach(),
    }
    return per_token, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss as in PPO implementations (Schulman et al. 2017) -> ``(scalar, stats)``.

        V_clip = V_old + clip(V − V_old, −c, c)
        loss = ½ · masked mean of max((V − R)², (V_clip − R)²)
    ``clip_range=None`` gives the plain ½ · masked mean of (V − R)².
    ``values`` (carries the gradient), ``old_values`` (rollout), ``returns``, ``mask``: ``[B, T]``.
    Detached stats: ``clipfrac`` = masked fraction of tokens where the clipped error is the larger.
    """
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return 0.5 * masked_mean(unclipped, mask), {"clipfrac": unclipped.new_zeros(()).detach()}
    values_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    clipped = (values_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, {"clipfrac": masked_mean((clipped > unclipped).to(values.dtype), mask).detach()}


@dataclass(frozen=True)
class PPOLossConfig:
    """The coefficients and choices of :func:`ppo_loss`."""

    policy_loss: str = "token"
    """A name in :data:`POLICY_LOSSES`: "token" (PPO) or "sequence" (one ratio per completion, RLOO)."""
    clip_eps: float = 0.2
    """ε of the ratio's clip (the lower one when ``clip_eps_high`` is set)."""
    clip_eps_high: float | None = None
    """ε_high of the ratio's clip (clip-higher, DAPO); None: ``clip_eps``."""
    vf_coef: float = 0.1
    """c1, the value loss's weight."""
    value_clip: float | None = 0.2
    """c of the value clip; None: no clip."""
    entropy_coef: float = 0.0
    """c2, the entropy bonus's weight."""
    kl_coef: float = 0.0
    """β_loss, the weight of the KL-to-reference term in the loss."""
    aggregation: str = "token-mean"
    """How the policy, entropy and KL terms reduce their tokens: a mode of :func:`rlhfkit.ops.aggregate_loss`."""
    max_len: int | None = None
    """The normaliser's length of "seq-mean-token-sum-norm" (the generation limit)."""
    importance_sampling_cap: float | None = None
    """C of the truncated importance weights against a separate sampling engine (given ``engine_logprobs``);
    None: no correction."""


class PPOLossTerms(NamedTuple):
    """The detached terms of one :func:`ppo_loss`, unweighted; None where the term was left out."""

    total: Tensor
    """The loss itself (detached)."""
    policy: Tensor | None
    """L_clip."""
    entropy: Tensor | None
    """H, the aggregated entropy."""
    clipfrac: Tensor | None
    """Fraction of tokens (sequence ratio: rows) where the clipped surrogate is the larger."""
    approx_kl: Tensor | None
    """½(lp − lp_old)² over tokens, the k2 estimate of the KL to the rollout policy."""
    value: Tensor | None
    """L_V."""
    value_clipfrac: Tensor | None
    """Fraction of tokens where the clipped value error is the larger."""
    kl: Tensor | None
    """The aggregated k3 KL to the reference."""


def ppo_loss(
    config: PPOLossConfig,
    mask: Tensor,
    *,
    logprobs: Tensor | None = None,
    old_logprobs: Tensor | None = None,
    advantages: Tensor | None = None,
    entropy: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    values: Tensor | None = None,
    old_values: Tensor | None = None,
    returns: Tensor | None = None,
    engine_logprobs: Tensor | None = None,
) -> tuple[Tensor, PPOLossTerms]:
    """The PPO loss of one (micro-)batch (Schulman et al. 2017, eq. 9, as a loss) -> ``(scalar, terms)``.

        L = L_clip + c1·L_V − c2·H + β_loss·KL

        L_clip = agg(w_t · l_t)     l_t from the policy loss ``config.policy_loss`` (:data:`POLICY_LOSSES`)
        L_V    = value_loss(V, V_old, R)    (½ · token mean of the clipped squared error)
        H      = agg(H_t)           the policy's entropy per token
        KL     = agg(k3(lp, lp_ref))        k3 = exp(lp_ref − lp) − (lp_ref − lp) − 1 (Schulman 2020)

    ``agg`` is :func:`rlhfkit.ops.aggregate_loss` with ``config.aggregation``. ``w_t`` is 1, or with
    ``engine_logprobs`` (the log-probs of the engine that sampled the tokens) and
    ``config.importance_sampling_cap`` C the truncated importance weight min(pi_old / pi_engine, C)
    (:func:`rlhfkit.ops.truncated_importance_weights`). Each term is there when its
    inputs are: the policy terms with ``logprobs`` (and ``old_logprobs``, ``advantages``), H with ``entropy``,
    KL with ``ref_logprobs``, L_V with ``values`` (and ``old_values``, ``returns``); so a pass over the policy
    alone gives L − c1·L_V and a pass over the value function alone c1·L_V, which add up to L.
    All tensors ``[B, T]``; ``mask`` 1 on the tokens that get a gradient.
    """
    zero = mask.new_zeros((), dtype=torch.float32)
    loss = zero
    policy = entropy_term = clipfrac = approx_kl = value = value_clipfrac = kl = None
    if logprobs is not None:
        per_token, stats = get_policy_loss(config.policy_loss)(
            logprobs, old_logprobs, advantages, mask, config.clip_eps, clip_eps_high=config.clip_eps_high
        )
        if engine_logprobs is not None and config.importance_sampling_cap is not None:
            cap = config.importance_sampling_cap
            per_token = per_token * truncated_importance_weights(old_logprobs, engine_logprobs, mask, cap)
        policy = aggregate_loss(per_token, mask, config.aggregation, config.max_len)
        clipfrac, approx_kl = stats["clipfrac"], stats["approx_kl"]
        loss = policy
    if values is not None:
        value, value_stats = value_loss(values, old_values, returns, mask, config.value_clip)
        value_clipfrac = value_stats["clipfrac"]
        loss = loss + config.vf_coef * value
    if entropy is not None:
        entropy_term = aggregate_loss(entropy, mask, config.aggregation, config.max_len)
        loss = loss - config.entropy_coef * entropy_term
    if ref_logprobs is not None:
        kl = aggregate_loss(kl_penalty(logprobs, ref_logprobs, "k3"), mask, config.aggregation, config.max_len)
        loss = loss + config.kl_coef * kl
    detached = [x.detach() if x is not None else None for x in (policy, entropy_term, value, kl)]
    terms = PPOLossTerms(
        loss.detach(), detached[0], detached[1], clipfrac, approx_kl, detached[2], value_clipfrac, detached[3]
    )
    return loss, terms


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution over the last dim: ``[..., V]`` -> ``[...]`` (e.g. ``[B, T]``).

        H = −Σ_v p_v·log p_v,  p = softmax(logits), log p = log_softmax(logits)
    log_softmax keeps it stable for large logits; tokens with p = 0 (logit −inf, e.g. after
    top-k filtering) contribute 0 rather than NaN. At a real vocabulary ``chunked_entropy`` gives the same
    values and gradients, in float32, without the four ``[B, T, V]`` temporaries of this formula.
    """
    log_probs = F.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    # Zero the −inf log-probs before multiplying: 0·(−inf) would be NaN in the value and the gradient.
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(dim=-1)


def bradley_terry_loss(
    chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, margin: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Pairwise reward-model loss (Bradley & Terry 1952; Ouyang et al. 2022) -> scalar.

        loss = mean of −log σ(s_c − s_r − margin)
    ``chosen_scores``, ``rejected_scores``: ``[B]``; ``margin``: ``[B]``, a float or None (= 0),
    the minimum score gap the pair should show (as in Llama 2's reward model).
    """
    diff = chosen_scores - rejected_scores
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff).mean()


def _dpo_sigmoid(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    # Rafailov et al. 2023, eq. 7; label smoothing = a preference label flipped with prob. ls.
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)


def _ipo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    # Azar et al. 2023, eq. 17, with τ = β: regress the log-ratio gap onto 1/(2τ).
    return (h - 1 / (2 * beta)) ** 2


_DPO_LOSSES: dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]] = {
    "sigmoid": _dpo_sigmoid,
    "ipo": _ipo,
}
DPO_LOSS_TYPES = tuple(_DPO_LOSSES)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Direct preference optimisation losses -> ``(losses[B], chosen_rewards[B], rejected_rewards[B])``.

    Inputs are ``[B]`` summed log-probs of the chosen / rejected responses under the policy π and
    the frozen reference. With h = (π_c − ref_c) − (π_r − ref_r):
        "sigmoid" (Rafailov et al. 2023): −(1−ls)·log σ(βh) − ls·log σ(−βh)
        "ipo" (Azar et al. 2023):         (h − 1/(2β))²   (label smoothing does not apply)
    Implicit rewards β·(π − ref) are returned detached, for logging.
    """
    if loss_type not in _DPO_LOSSES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of {', '.join(DPO_LOSS_TYPES)}")
    if loss_type == "ipo" and label_smoothing != 0:
        raise ValueError("label_smoothing applies only to loss_type 'sigmoid', not 'ipo'")
    chosen_log_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_log_ratio = policy_rejected_logps - ref_rejected_logps
    losses = _DPO_LOSSES[loss_type](chosen_log_ratio - rejected_log_ratio, beta, label_smoothing)
    return losses, beta * chosen_log_ratio.detach(), beta * rejected_log_ratio.detach()
