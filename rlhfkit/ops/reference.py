"""A moving reference policy: the exponential moving average of the policy (Xu et al. 2024, "Is DPO Superior
to PPO for LLM Alignment?"; as in TR-DPO, Gorbatovski et al. 2024). After each optimizer step, for every
parameter θ:

    θ_ref ← (1 − α) · θ_ref + α · θ_policy

α = 0 keeps the reference frozen; α = 1 copies the policy every step. The KL penalty then measures the drift
from a recent average of the policy rather than from the start.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def ema_update(reference: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """Move ``reference``'s parameters and floating-point buffers toward ``policy``'s in place: ref ← (1 − α)·ref
    + α·policy. The two modules must have the same parameter names and shapes (a reference and its policy)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    source = dict(policy.named_parameters())
    source.update((name, b) for name, b in policy.named_buffers() if b.is_floating_point())
    for name, target in [*reference.named_parameters(), *reference.named_buffers()]:
        if not target.is_floating_point():
            continue
        if name not in source:
            raise ValueError(f"the policy has no '{name}' to move the reference toward")
        target.lerp_(source[name].to(device=target.device, dtype=target.dtype), alpha)
