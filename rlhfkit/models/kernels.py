"""Swap slow activation modules for fused ones that compute the same function.

GPT-2-family models ("gelu_new") build the tanh approximation of GELU,
``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, out of ~8 separate tensor ops, each reading and
writing the whole ``[B, L, 4H]`` activation and each saving inputs for backward. PyTorch has the same
formula as one kernel (``F.gelu(x, approximate="tanh")``). On this project's CPU benchmark the fused
version's forward + backward is ~3.5x faster at the small model's MLP shape, ~7% of a PPO step.
Outputs agree to float rounding (~2e-7); weights and saved configs are untouched.
"""

from __future__ import annotations

import torch
from torch import nn


class TanhGELU(nn.Module):
    """GELU, tanh approximation, as one fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate="tanh")


def _tanh_gelu_classes() -> tuple[type, ...]:
    try:
        from transformers.activations import FastGELUActivation, NewGELUActivation
    except ImportError:  # pragma: no cover - every supported transformers has both
        return ()
    return (NewGELUActivation, FastGELUActivation)


def fuse_activations(model: nn.Module) -> int:
    """Replace tanh-GELU modules built from elementwise ops by ``TanhGELU``; returns how many."""
    slow = _tanh_gelu_classes()
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in slow:
                setattr(parent, name, TanhGELU())
                replaced += 1
    return replaced
