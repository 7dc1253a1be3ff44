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
    reward (with ``kl_in_reward``). A row's prompt group is ``r.group_ids``. Counts the zero-std groups into
    ``metrics``."""
    mask = r.action_mask.float()
    valid, scores = r.valid, r.scores
    groups = ops.Groups(r.group_ids)
    # 5. Per-token rewards: the reward at the last real token, minus beta*KL_t when the KL is in the reward.
    # An environment's per-turn rewards sit at their turns' last tokens and the rest of the score at the last.
    if cfg.advantage.num_generations > 1:
        scores = fill_invalid_from_group(scores, valid, groups)  # rows no reward applies to: the group mean
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
    advantages, returns = estimate_advantages(rewards, mask, r.values, cfg, r.group_ids)
    if cfg.advantage.whiten_advantages and cfg.needs_critic:
        advantages = ops.masked_whiten(advantages, mask) * mask
    loss_mask = gradient_mask(r.action_mask, r.finished, scores, valid, groups, cfg, metrics)
    advantages = advantages * valid.unsqueeze(1).to(advantages.dtype)  # no reward applies: advantage 0
    return replace(r, loss_mask=loss_mask, scores=scores, rewards=rewards, advantages=advantages, returns=returns)


def estimate_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor | None,
    cfg: OnlineConfig,
    group_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 6's estimator (``--advantage``) on ``[B, T]`` per-token rewards: (advantages, returns), on the
    policy's tokens ``mask`` only (``action_order``). ``group_ids`` ``[B]``: each row's prompt group, which the
    group estimators compare within (None: contiguous groups of ``--num-generations``)."""
    a = cfg.advantage
    estimator = ops.get_advantage_estimator(a.advantage)
    config = ops.AdvantageConfig(
        gamma=a.gamma, lam=a.lam, group_size=a.num_generations, scale=a.scale_rewards, group_ids=group_ids
    )
    order = action_order(mask)
    if order is None:
        return estimator(rewards, mask, config, values)
    values = values.gather(1, order) if values is not None else None
    compact = estimator(rewards.gather(1, order), mask.gather(1, order), config, values)
    advantages, returns = (torch.zeros_like(x).scatter(1, order, x) for x in compact)
    return advantages, returns


def gradient_mask(
    action_mask, finished, scores, valid, groups: ops.Groups, cfg: OnlineConfig, metrics: dict
) -> torch.Tensor:
    """``[B, T]`` the tokens that get a gradient: the policy's, less the rows left out of the update
    (no reward applies; cut off with --mask-truncated-completions; a zero-std group with
    --drop-zero-std-groups). ``groups``: the rows' prompt groups. Also counts the zero-std groups into
    ``metrics``."""
    keep = valid.clone()
    if cfg.policy.mask_truncated_completions:
        keep &= finished
    if cfg.advantage.num_generations > 1 and cfg.compares_group:
        grouped = groups.matrix(scores)  # [K, G]
        low = torch.where(groups.mask, grouped, torch.inf).min(dim=1).values
        high = torch.where(groups.mask, grouped, -torch.inf).max(dim=1).values
        flat = (high - low) == 0  # [K] the group's rewards are all equal
        metrics["rollout/zero_std_groups"] = float(flat.sum())
        if cfg.advantage.drop_zero_std_groups:
            keep &= ~groups.rows(flat.unsqueeze(1).expand_as(grouped))
    if bool(keep.all()):
        return action_mask
    return action_mask * keep.unsqueeze(1).to(action_mask.dtype)


def fill_invalid_from_group(scores: torch.Tensor, valid: torch.Tensor, groups: ops.Groups) -> torch.Tensor:
    """``[B]`` scores with each row that no reward applies to replaced by its group's mean over the rows one
    applies to (0 when none does), so it moves no baseline; its advantage is then set to 0. ``groups``: the rows'
    prompt groups."""
    if bool(valid.all()):
        return scores
    grouped, ok = groups.matrix(scores), groups.matrix(valid.to(scores.dtype))  # [K, G]
    means = (grouped * ok).sum(dim=1, keepdim=True) / ok.sum(dim=1, keepdim=True).clamp(min=1)
    return groups.rows(torch.where(ok.bool(), grouped, means))
