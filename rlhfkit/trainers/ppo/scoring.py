"""Step 2 of PPO: turn reward-model scores into the scalar reward of each response."""

from __future__ import annotations

import torch

from rlhfkit.config.commands import PPOArgs
from rlhfkit.models.reward import ScoreOutput


def shape_scores(
    scores: ScoreOutput,
    response_mask: torch.Tensor,
    ppo: PPOArgs,
    stats: dict | None,
    conservative_k: float,
    eos_id: int | None,
    response_ids: torch.Tensor,
) -> torch.Tensor:
    """``[B]`` reward from the reward model's ``[B]`` scores (and spread, for an ensemble): ensemble choice,
    normalisation, missing-EOS penalty, clipping.

    - ensemble_mode 'conservative': ``mean − k·std`` (a pessimistic score, harder to exploit);
    - normalize_reward: ``(s − μ)/σ`` with the statistics saved beside the reward model;
    - missing_eos_penalty: subtract it from responses that never emitted EOS;
    - reward_clip: clip to ``±c``.
    """
    score = scores.conservative(conservative_k) if ppo.ensemble_mode == "conservative" else scores.mean
    score = score.to(response_mask.device).float()
    if ppo.normalize_reward and stats:
        score = (score - stats["mean"]) / max(stats["std"], 1e-6)
    if ppo.missing_eos_penalty is not None and eos_id is not None:
        has_eos = ((response_ids == eos_id) & response_mask.bool()).any(dim=1)
        score = torch.where(has_eos, score, score - ppo.missing_eos_penalty)
    if ppo.reward_clip is not None:
        score = score.clamp(-ppo.reward_clip, ppo.reward_clip)
    return score
