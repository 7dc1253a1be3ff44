"""The KL coefficient β of the PPO reward r = score − β·KL, fixed or adapted (Ziegler et al. 2019).

Both controllers have ``.value`` (β now), ``.update(current_kl, n_steps)``, and
``state_dict()`` / ``load_state_dict(d)`` so a checkpoint can restore β exactly.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class KLController(Protocol):
    value: float

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class FixedKLController:
    """Constant β: ``update`` does nothing."""

    def __init__(self, coef: float):
        self.value = float(coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target`` (Ziegler et al. 2019, §2.2).

        e = clip(KL / target − 1, −0.2, 0.2)
        β ← β · (1 + e · n_steps / horizon)
    ``n_steps``: samples (or steps) since the last update; ``horizon``: how many of them it takes
    to move β by the full error. β grows while KL is above target and shrinks while below.
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be positive, got target={target}, horizon={horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))
