"""Advantages without a value head: GRPO, RLOO, REINFORCE++.

Shapes: ``[B]`` = one number per completion; ``[B, T]`` = batch × response tokens, ``mask`` 1 on real
tokens. Group estimators compare the completions of one prompt: ``group_ids`` (LongTensor ``[B]``) names each
row's group (:class:`rlhfkit.ops.groups.Groups`: any order, groups of any size), or ``group_size`` G says that rows
``[k·G, (k+1)·G)`` form group k (B a multiple of G). Give one of the two.
"""

from __future__ import annotations

import torch

from .groups import Groups
from .stats import masked_whiten

GRPO_SCALES = ("group", "batch", "none")


def _groups(
    rewards: torch.Tensor, group_size: int | None, group_ids: torch.Tensor | None
) -> tuple[torch.Tensor, Groups]:
    """(``rewards`` as floats, their groups) after checking the shapes."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if (group_size is None) == (group_ids is None):
        raise ValueError("give either group_size or group_ids")
    if group_ids is not None:
        if group_ids.shape != rewards.shape:
            raise ValueError(
                f"group_ids must have the rewards' shape {tuple(rewards.shape)}, got {tuple(group_ids.shape)}"
            )
        return rewards, Groups(group_ids.to(rewards.device))
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"batch size {rewards.shape[0]} is not a multiple of group_size {group_size}")
    return rewards, Groups.contiguous(rewards.shape[0], group_size, rewards.device)


def _unbiased_std(x: torch.Tensor) -> torch.Tensor:
    """Unbiased std (Bessel's correction) over all of ``x``; fewer than 2 elements give 0 instead of NaN (the
    centred values are 0 there anyway)."""
    return x.std() if x.numel() >= 2 else x.new_zeros(())


def grpo_advantages(
    rewards: torch.Tensor,
    group_size: int | None = None,
    scale: str = "group",
    eps: float = 1e-4,
    *,
    group_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Group-relative advantage of each completion -> ``[B]`` (GRPO, Shao et al. 2024, DeepSeekMath).

        scale="group":  A_i = (r_i − mean_g) / (std_g + eps)
        scale="batch":  A_i = (r_i − mean_g) / (std_batch + eps)
        scale="none":   A_i =  r_i − mean_g                 (Dr. GRPO, Liu et al. 2025)

    mean_g and std_g are over the completions of row i's group g (``group_ids`` ``[B]``, or contiguous groups of
    ``group_size``); std is unbiased (divides by n − 1); std_batch is over all B rewards. ``rewards``: ``[B]``, one
    scalar per completion. The std of a single element is taken as 0, so a group of one gets advantage 0, not NaN.
    Raises ValueError if B is not a multiple of ``group_size`` or ``scale`` is unknown.
    """
    if scale not in GRPO_SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose one of {', '.join(GRPO_SCALES)}")
    rewards, groups = _groups(rewards, group_size, group_ids)
    grouped = groups.matrix(rewards)  # [K, G]
    centred = grouped - groups.mean(grouped)
    if scale == "group":
        centred = centred / (groups.std(grouped) + eps)
    elif scale == "batch":
        centred = centred / (_unbiased_std(rewards) + eps)
    return groups.rows(centred)


def rloo_advantages(
    rewards: torch.Tensor, group_size: int | None = None, *, group_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """REINFORCE leave-one-out advantage -> ``[B]`` (RLOO, Ahmadian et al. 2024).

        A_i = r_i − mean_{j≠i} r_j = n_g/(n_g−1) · (r_i − mean_g)

    the baseline of each completion is the mean reward of the other n_g − 1 completions of its group (``group_ids``
    ``[B]``, or contiguous groups of ``group_size``), so it is independent of the completion and the estimate stays
    unbiased. ``rewards``: ``[B]``. A group of one has no other completions and no baseline: its advantage is 0 (no
    learning signal), not NaN. Raises ValueError if B is not a multiple of ``group_size``.
    """
    rewards, groups = _groups(rewards, group_size, group_ids)
    grouped = groups.matrix(rewards)  # [K, G]
    others = (groups.count(grouped) - 1).clamp(min=1)  # [K, 1] n_g − 1
    others_mean = (groups.sum(grouped) - grouped) / others
    alone = groups.count(grouped) < 2  # [K, 1]
    return groups.rows(torch.where(alone, 0.0, grouped - others_mean))


def reinforce_pp_baseline(
    scores: torch.Tensor, group_size: int | None = None, *, group_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Score minus the mean score of its group -> ``[B]`` (REINFORCE++-baseline, Hu 2025).

        b_i = s_i − mean_g

    the baseline of REINFORCE++-baseline; the result is then whitened over the whole batch (see
    :data:`rlhfkit.ops.ADVANTAGE_ESTIMATORS` ``"reinforce_pp_baseline"``). Equals
    ``grpo_advantages(scores, scale="none")`` with the same groups. ``scores``: ``[B]``; ``group_ids`` ``[B]`` or
    contiguous groups of ``group_size``. A group of one gives 0.
    """
    return grpo_advantages(scores, group_size, scale="none", group_ids=group_ids)


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
