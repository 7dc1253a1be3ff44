"""How a per-token loss ``[B, T]`` becomes the scalar that is back-propagated.

``mask`` is 1 on real response tokens and 0 on padding; padding never enters the loss, whatever it holds.
"""

from __future__ import annotations

import torch

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate_loss(
    per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss ``l`` ``[B, T]`` with ``mask`` ``m`` ``[B, T]`` to a scalar.

        "token-mean":              Σ_{b,t} l·m / Σ_{b,t} m
            every real token weighs the same, so long completions weigh more (DAPO, Yu et al. 2025).
        "seq-mean-token-mean":     mean over rows b with Σ_t m > 0 of  Σ_t l·m / Σ_t m
            every completion weighs the same (GRPO, Shao et al. 2024). Rows without real tokens are
            excluded from the mean; if no row has a token the loss is 0.
        "seq-mean-token-sum-norm": Σ_{b,t} l·m / (B · max_len)
            a constant normaliser, no length bias (Dr. GRPO, Liu et al. 2025); ``max_len`` defaults
            to the mask's T and should be the generation limit so it is the same for every batch.

    An empty mask gives 0, never NaN, in every mode, for the value and the gradient.
    Raises ValueError on an unknown ``mode`` or a ``max_len`` < 1.
    """
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}")
    real = mask.bool()
    masked = torch.where(real, per_token_loss, 0.0)  # padding may hold inf, and inf·0 is NaN
    if mode == "token-mean":
        return masked.sum() / real.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        tokens_per_row = real.sum(dim=-1)  # [B]
        row_means = masked.sum(dim=-1) / tokens_per_row.clamp(min=1)  # [B]; 0 for empty rows
        has_tokens = tokens_per_row > 0
        return row_means.sum() / has_tokens.sum().clamp(min=1)
    if max_len is None:
        max_len = per_token_loss.shape[-1]
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    return masked.sum() / (per_token_loss.shape[0] * max_len)
