"""Per-token estimators of KL(π ‖ π_ref) from sampled tokens.

Schulman, "Approximating KL Divergence" (2020 blog post). With the log-ratio
log r = lp_ref − lp for a token sampled from π:
    k1 = −log r                  unbiased, high variance, can be negative
    k2 = ½ (log r)²              biased, low variance, always ≥ 0
    k3 = (r − 1) − log r         unbiased, low variance, always ≥ 0
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda log_ratio: -log_ratio,
    "k2": lambda log_ratio: 0.5 * log_ratio**2,
    "k3": lambda log_ratio: torch.expm1(log_ratio) - log_ratio,
}
KL_ESTIMATORS = tuple(_ESTIMATORS)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference -> ``[B, T]``.

    ``logprobs``, ``ref_logprobs``: ``[B, T]`` log-probs of the sampled tokens under π and π_ref.
    estimator "k1": lp − lp_ref;  "k2": ½(lp − lp_ref)²;
              "k3": exp(lp_ref − lp) − 1 − (lp_ref − lp)
    (Schulman 2020). Padding is not masked here.
    """
    if estimator not in _ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")
    return _ESTIMATORS[estimator](ref_logprobs - logprobs)
