"""Losses: PPO policy (clip-higher, sequence ratio) and value, entropy, Bradley–Terry reward model, DPO / IPO.

Shapes: ``[B, T]`` = batch × response tokens; ``mask`` is 1 on real tokens, 0 on padding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .stats import masked_mean


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
