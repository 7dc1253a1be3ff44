"""Per-token rewards and advantage estimates for RLHF with PPO.

Shapes: ``[B, T]`` = batch × response tokens; ``mask`` is 1 on real tokens, 0 on (right) padding.
"""

from __future__ import annotations

import torch


def per_token_rewards(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float | torch.Tensor
) -> torch.Tensor:
    """KL-penalised reward for every response token -> ``[B, T]`` (Ziegler et al. 2019).

    r_t = −β·KL_t on real tokens, and the sequence's reward-model score is added at its last real
    token: r_last += score. ``scores``: ``[B]``; ``kl``: ``[B, T]`` per-token KL estimate;
    ``kl_coef``: β. Padding gets 0; a row whose mask is all 0 gets 0 everywhere.
    """
    mask = mask.to(kl.dtype)
    rewards = -kl_coef * kl * mask
    positions = torch.arange(mask.shape[-1], device=mask.device, dtype=mask.dtype)
    last = (positions * mask).argmax(dim=-1)  # [B] index of the last real token
    has_tokens = mask.sum(dim=-1) > 0  # [B]
    score_at_last = torch.zeros_like(rewards)
    score_at_last[torch.arange(len(last), device=last.device), last] = scores.to(kl.dtype)
    return rewards + score_at_last * has_tokens.unsqueeze(-1)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016) -> ``(advantages, returns)``, ``[B, T]`` each.

        δ_t = r_t + γ·V_{t+1}·m_{t+1} − V_t
        A_t = δ_t + γλ·m_{t+1}·A_{t+1}          (V_T = A_T = m_T = 0)
        returns_t = A_t + V_t                  (the λ-return, target of the value head)

    ``rewards``, ``values``, ``mask``: ``[B, T]``. The factor m_{t+1} ends each episode at its last real
    token, so right-padded rows of different lengths are handled in one batch. Padding positions
    get advantage 0 and therefore returns = V there: a value loss that forgets the mask still
    sees zero error on padding instead of a spurious target.
    """
    mask = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])  # V_{t+1}·m_{t+1}, [B]
    next_advantage = torch.zeros_like(values[:, 0])  # A_{t+1}·m_{t+1}, [B]
    advantages_reversed = []
    for t in reversed(range(values.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        advantages_reversed.append(next_advantage)
    advantages = torch.stack(advantages_reversed[::-1], dim=-1)
    return advantages, advantages + values


def sequence_advantage(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence-level advantage A = R − V(s) broadcast to every real token -> ``(advantages, returns)``.

    The whole response is one action (a bandit view, as in REINFORCE with a learned baseline):
        R = Σ_t r_t·m_t                   total reward of the sequence, ``[B]``
        V(s) = V at the first real token  value of the prompt state, ``[B]``
        advantages_t = (R − V(s))·m_t,    returns_t = R on real tokens
    ``rewards`` (per-token total rewards, e.g. from :func:`per_token_rewards`), ``values``, ``mask``:
    ``[B, T]``. Padding gets advantage 0 and returns = V (same convention as :func:`gae`).
    """
    mask = mask.to(values.dtype)
    total_reward = (rewards * mask).sum(dim=-1, keepdim=True)  # [B, 1]
    first = mask.argmax(dim=-1, keepdim=True)  # [B, 1] index of the first real token
    state_value = values.gather(-1, first)  # [B, 1]
    advantages = (total_reward - state_value) * mask
    returns = torch.where(mask > 0, total_reward.expand_as(values), values)
    return advantages, returns
