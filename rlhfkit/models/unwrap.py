"""The model inside the wrappers that training adds (DDP / accelerate, PEFT), in one place."""

from __future__ import annotations

from torch import nn


def without_ddp(model: nn.Module) -> nn.Module:
    """The module under a DDP / accelerate wrapper (the model itself when there is none)."""
    return getattr(model, "module", model)


def base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside DDP and PEFT wrappers: the one whose config and forward are read."""
    model = without_ddp(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model
