"""Step 2 of PPO: turn reward-model scores into the scalar reward of each response."""

from __future__ import annotations

import torch


def shape_scores(raw: torch.Tensor, std: torch.Tensor | None, response_mask: torch.Tensor, ppo, stats: dict | None,
                 conservative_k: float, eos_id: int | None, response_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` reward from ``[B]`` RM scores: ensemble choice, normalisation, missing-EOS penalty, clipping.

    - ensemble_mode 'conservative': ``mean − k·std`` (a pessimistic score, harder to exploit);
    - normalize_reward: ``(s − μ)/σ`` with the statistics saved beside the reward model;
    - missing_eos_penalty: subtract it from responses that never emitted EOS;
    - reward_clip: clip to ``±c``.
    """
    score = raw - conservative_k * std if (ppo.ensemble_mode == "conservative" and std is not None) else raw
    if ppo.normalize_reward and stats:
        score = (score - stats["mean"]) / max(stats["std"], 1e-6)
    if ppo.missing_eos_penalty is not None and eos_id is not None:
        has_eos = ((response_ids == eos_id) & response_mask.bool()).any(dim=1)
        score = torch.where(has_eos, score, score - ppo.missing_eos_penalty)
    if ppo.reward_clip is not None:
        score = score.clamp(-ppo.reward_clip, ppo.reward_clip)
    return score
