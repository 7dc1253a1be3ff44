"""Masked statistics over ``[B, T]`` tensors.

``mask`` is 1 on real response tokens and 0 on padding. Padding never enters a statistic.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1.

    ``dim=None``: sum(x·m) / sum(m) over the whole batch -> scalar.
    ``dim=d``: the same along dimension ``d`` only (``dim=-1`` on ``[B, T]`` -> ``[B]``, one mean per row).

    An empty mask (sum 0) gives 0 instead of NaN, so one empty row cannot poison a batch.
    """
    mask = mask.to(x.dtype)
    total = (x * mask).sum() if dim is None else (x * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=torch.finfo(x.dtype).tiny)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over the masked positions of the whole batch -> scalar.

    var = masked_mean((x − μ)²), times n / (n − 1) when ``unbiased`` (Bessel's correction),
    where n = sum(mask). Raises ValueError when ``unbiased`` and n < 2.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.to(x.dtype).sum()
        if n < 2:
            raise ValueError(f"unbiased masked_var needs at least 2 masked elements, got {float(n):g}")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean, unit variance over the masked positions.

    whitened = (x − μ) · rsqrt(σ² + 1e-8), with μ, σ² the masked mean and unbiased masked variance.
    With ``shift_mean=False`` the mean is added back: only the scale changes (used for rewards).
    Same shape as ``x``; padding positions are transformed too, callers mask them downstream.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How much of the returns' variance the value head explains -> scalar.

    ev = 1 − Var[R − V] / Var[R] over masked positions (the PPO diagnostic of Schulman et al. 2017,
    as logged by common implementations). 1 is perfect, 0 is no better than a constant,
    negative is worse. NaN when the returns have zero variance.
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns - values, mask, unbiased=False)
    nan = torch.full_like(var_returns, float("nan"))
    return torch.where(var_returns == 0, nan, 1 - var_residual / var_returns)
