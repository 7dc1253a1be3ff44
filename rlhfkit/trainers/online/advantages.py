"""Steps 5-6 of the online loop on a whole batch: per-token rewards, advantages and returns (the algorithm's
estimator from ``rlhfkit.ops.estimators``), and which tokens get a gradient."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlhfkit import ops
from rlhfkit.config.online import OnlineConfig
from rlhfkit.trainers.online.rollout import Rollout, action_order


def assign_rewards_and_advantages(
    r: Rollout, cfg: OnlineConfig, kl_coef: float, kl_in_reward: bool, metrics: dict
) -> Rollout:
    """Steps 5-6 on a whole batch ``r``: its per-token rewards, advantages, returns and loss mask. Only the
    policy's tokens (``action_mask``) take part: in a multi-turn rollout the estimators see its replies as one
    sequence, the tool and environment tokens between them left out. ``kl_coef``: beta of the KL penalty in the
    reward (with ``kl_in_reward``). Counts the zero-std groups into ``metrics``."""
    mask = r.action_mask.float()
    valid, scores = r.valid, r.scores
    # 5. Per-token rewards: the reward at the last real token, minus beta*KL_t when the KL is in the reward.
    # An environment's per-turn rewards sit at their turns' last tokens and the rest of the score at the last.
    G = cfg.advantage.num_generations
    if G > 1:
        scores = fill_invalid_from_group(scores, valid, G)  # rows no reward applies to: the group mean
    early = r.turn_rewards * valid.unsqueeze(1).to(r.turn_rewards.dtype)
    last = scores - early.sum(dim=1)
    if kl_in_reward:
        kl = ops.kl_penalty(r.logprobs, r.ref_logprobs, cfg.kl.kl_estimator) * mask
        rewards = ops.per_token_rewards(last, kl, mask, kl_coef) + early
    else:
        rewards = ops.per_token_rewards(last, torch.zeros_like(mask), mask, 0.0) + early
    if cfg.advantage.whiten_rewards and cfg.needs_critic:
        rewards = ops.masked_whiten(rewards, mask, shift_mean=False) * mask
    # 6. Advantages.
    advantages, returns = estimate_advantages(rewards, mask, r.values, cfg)
    if cfg.advantage.whiten_advantages and cfg.needs_critic:
        advantages = ops.masked_whiten(advantages, mask) * mask
    loss_mask = gradient_mask(r.action_mask, r.finished, scores, valid, cfg, metrics)
    advantages = advantages * valid.unsqueeze(1).to(advantages.dtype)  # no reward applies: advantage 0
    return replace(r, loss_mask=loss_mask, scores=scores, rewards=rewards, advantages=advantages, returns=returns)


def estimate_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None, cfg: OnlineConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 6's estimator (``--advantage``) on ``[b, T]`` per-token rewards: (advantages, returns), on the
    policy's tokens ``mask`` only (``action_order``)."""
    a = cfg.advantage
    estimator = ops.get_advantage_estimator(a.advantage)
    config = ops.AdvantageConfig(gamma=a.gamma, lam=a.lam, group_size=a.num_generations, scale=a.scale_rewards)
    order = action_order(mask)
    if order is None:
        return estimator(rewards, mask, config, values)
    values = values.gather(1, order) if values is not None else None
    compact = estimator(rewards.gather(1, order), mask.gather(1, order), config, values)
    advantages, returns = (torch.zeros_like(x).scatter(1, order, x) for x in compact)
    return advantages, returns


def gradient_mask(action_mask, finished, scores, valid, cfg: OnlineConfig, metrics: dict) -> torch.Tensor:
    """``[B, T]`` the tokens that get a gradient: the policy's, less the rows left out of the update
    (no reward applies; cut off with --mask-truncated-completions; a zero-std group with
    --drop-zero-std-groups). Also counts the zero-std groups into ``metrics``."""
    keep = valid.clone()
    if cfg.policy.mask_truncated_completions:
        keep &= finished
    G = cfg.advantage.num_generations
    if G > 1 and cfg.compares_group:
        groups = scores.view(-1, G)
        flat = (groups.max(dim=1).values - groups.min(dim=1).values) == 0  # [B / G]
        metrics["rollout/zero_std_groups"] = float(flat.sum())
        if cfg.advantage.drop_zero_std_groups:
            keep &= ~flat.repeat_interleave(G)
    if bool(keep.all()):
        return action_mask
    return action_mask * keep.unsqueeze(1).to(action_mask.dtype)


def fill_invalid_from_group(scores: torch.Tensor, valid: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]`` scores with each row that no reward applies to replaced by its group's mean over the rows one
    applies to (0 when none does), so it moves no baseline; its advantage is then set to 0."""
    if bool(valid.all()):
        return scores
    groups, ok = scores.view(-1, group_size), valid.view(-1, group_size).to(scores.dtype)
    means = (groups * ok).sum(dim=1, keepdim=True) / ok.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.where(ok.bool(), groups, means).view(-1)
