"""Advantages without a value head: GRPO, RLOO, REINFORCE++.

Shapes: ``[B]`` = one number per completion; ``[B, T]`` = batch × response tokens, ``mask`` 1 on real
tokens. Group estimators take ``group_size`` G: rows ``[k·G, (k+1)·G)`` are the G completions of one
prompt, so B must be a multiple of G.
"""

from __future__ import annotations

import torch

from .stats import masked_whiten

GRPO_SCALES = ("group", "batch", "none")


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]`` -> ``[B/G, G]``, one row per prompt, after checking the shapes."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"batch size {rewards.shape[0]} is not a multiple of group_size {group_size}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    return rewards.view(-1, group_size)


def _unbiased_std(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased std (Bessel's correction), over ``dim`` kept as size 1 or over all of ``x``.

    Fewer than 2 elements give 0 instead of NaN: the centred values are 0 there anyway.
    """
    n = x.numel() if dim is None else x.shape[dim]
    if n < 2:
        return x.new_zeros(())
    return x.std() if dim is None else x.std(dim=dim, keepdim=True)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantage of each completion -> ``[B]`` (GRPO, Shao et al. 2024, DeepSeekMath).

        scale="group":  A_i = (r_i − mean_g) / (std_g + eps)
        scale="batch":  A_i = (r_i − mean_g) / (std_batch + eps)
        scale="none":   A_i =  r_i − mean_g                 (Dr. GRPO, Liu et al. 2025)

    mean_g and std_g are over the G completions of row i's prompt; std is unbiased (divides by
    n − 1); std_batch is over all B rewards. ``rewards``: ``[B]``, one scalar per completion.
    The std of a single element is taken as 0, so G = 1 gives all-zero advantages, not NaN.
    Raises ValueError if B is not a multiple of ``group_size`` or ``scale`` is unknown.
    """
    if scale not in GRPO_SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose one of {', '.join(GRPO_SCALES)}")
    grouped = _grouped(rewards, group_size)  # [B/G, G]
    centred = grouped - grouped.mean(dim=-1, keepdim=True)
    if scale == "group":
        centred = centred / (_unbiased_std(grouped, dim=-1) + eps)
    elif scale == "batch":
        centred = centred / (_unbiased_std(grouped) + eps)
    return centred.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out advantage -> ``[B]`` (RLOO, Ahmadian et al. 2024).

        A_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − mean_g)

    the baseline of each completion is the mean reward of the other G − 1 completions of the same
    prompt, so it is independent of the completion and the estimate stays unbiased.
    ``rewards``: ``[B]``. With G = 1 there are no other completions and no baseline: the advantages
    are all 0 (no learning signal), not NaN. Raises ValueError if B is not a multiple of ``group_size``.
    """
    grouped = _grouped(rewards, group_size)  # [B/G, G]
    if group_size == 1:
        return torch.zeros_like(grouped).reshape(-1)
    others_mean = (grouped.sum(dim=-1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others_mean).reshape(-1)


def reinforce_pp_baseline(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Score minus the mean score of its group -> ``[B]`` (REINFORCE++-baseline, Hu 2025).

        b_i = s_i − mean_g

    the baseline of REINFORCE++-baseline; the result is then whitened over the whole batch (see
    :data:`rlhfkit.ops.ADVANTAGE_ESTIMATORS` ``"reinforce_pp_baseline"``). Equals
    ``grpo_advantages(scores, group_size, scale="none")``. ``scores``: ``[B]``. G = 1 gives zeros.
    """
    return grpo_advantages(scores, group_size, scale="none")


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reward-to-go of every token -> ``[B, T]`` (as used by REINFORCE++, Hu 2025).

        G_t = Σ_{s ≥ t, m_s = 1} γ^{s−t} · r_s    on real tokens;   G_t = 0 where m_t = 0

    ``rewards``, ``mask``: ``[B, T]``; rewards at padding are ignored, whatever they hold. A masked
    position inside a row adds no reward but still counts one step of discount. For REINFORCE++ the
    rewards are the score at the last real token minus β·KL_t (:func:`rlhfkit.ops.per_token_rewards`).
    """
    mask = mask.to(rewards.dtype)
    rewards = torch.where(mask > 0, rewards, 0.0)
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[:-1])  # G_{t+1} counting masked steps in the discount, [B]
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running * mask[:, t]
    return returns


def reinforce_pp_advantages(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025) -> ``(advantages, returns)``, ``[B, T]`` each.

        returns = discounted_returns(r, mask, γ)
        A = (returns − μ) / sqrt(σ² + 1e-8) on real tokens, 0 on padding

    μ, σ² are the masked mean and unbiased variance over every real token of the batch (global
    whitening, no per-prompt baseline). ``token_rewards``, ``mask``: ``[B, T]``; the rewards are the
    score at the last real token minus β·KL_t. Needs at least 2 real tokens in the batch.
    """
    returns = discounted_returns(token_rewards, mask, gamma)
    advantages = masked_whiten(returns, mask) * mask.to(returns.dtype)
    return advantages, returns
