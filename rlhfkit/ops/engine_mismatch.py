"""The mismatch between the engine that sampled a rollout and the trainer's forward pass of the same policy.

A separate inference engine (vLLM) computes the sampling distribution with its own kernels, so its log-prob of a
sampled token differs a little from the trainer's ``log pi_old`` of that token even with the same weights (and
more when the engine's weights lag behind by a few steps). Shapes: ``[B, T]`` batch x response tokens, ``mask``
1 on the tokens the policy sampled.
"""

from __future__ import annotations

import torch

from .stats import masked_mean


def logprob_gap(trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of the two log-probs of the sampled tokens, over the masked tokens (a scalar).

    gap = sum_t m_t |lp_old_t - lp_engine_t| / sum_t m_t
    """
    return masked_mean((trainer_logprobs - engine_logprobs).abs(), mask)


def truncated_importance_weights(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weights ``[B, T]`` of the trainer's policy against the engine's sampling policy.

        w_t = min(exp(lp_old_t - lp_engine_t), C)      (1 on padding)

    The tokens were drawn from pi_engine while the PPO ratio is taken against pi_old, so each token's policy
    loss is multiplied by w_t: the off-policy correction of truncated importance sampling (Ionides 2008; for
    RL fine-tuning with a separate rollout engine, Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
    You Off-Policy RL Training"). The cap C bounds the variance a token the engine found unlikely would bring.
    The weights are constants (no gradient).
    """
    if cap <= 0:
        raise ValueError(f"truncated_importance_weights: the cap must be > 0, got {cap}")
    w = torch.exp(trainer_logprobs.detach() - engine_logprobs.detach()).clamp(max=cap)
    return torch.where(mask.bool(), w, torch.ones_like(w))
