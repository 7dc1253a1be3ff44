"""The reward PPO optimises from a reward-model ensemble (Coste et al. 2023, "Reward Model Ensembles Help
Mitigate Overoptimization"). With ``s``: ``[K, B]`` the scores of K members for B completions:

    mean         r = (1/K) Σ_k s_k                      the ensemble average
    worst-case   r = min_k s_k                          WCO: the most pessimistic member
    uncertainty  r = mean − k · std_k(s)                UWO: the mean, penalised where the members disagree

Coste et al. penalise the variance with a weight λ; the standard deviation used here has the scores' unit, so
k is a number of standard deviations (the ``--conservative-k`` a reward model ensemble was trained with).
With one member every objective is that member's score.
"""

from __future__ import annotations

import torch

ENSEMBLE_OBJECTIVES = ("mean", "worst-case", "uncertainty")


def ensemble_reward(scores: torch.Tensor, objective: str = "mean", k: float = 1.0) -> torch.Tensor:
    """``[B]`` reward from ``[K, B]`` member scores: the mean, the minimum over members, or mean − k·std
    (unbiased std over the K members; 0 for K = 1)."""
    if objective not in ENSEMBLE_OBJECTIVES:
        raise ValueError(f"unknown ensemble objective {objective!r}; choose one of {', '.join(ENSEMBLE_OBJECTIVES)}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [K, B], got shape {tuple(scores.shape)}")
    mean = scores.mean(dim=0)
    if objective == "mean" or scores.shape[0] == 1:
        return mean
    if objective == "worst-case":
        return scores.min(dim=0).values
    return mean - k * scores.std(dim=0)
