"""A swap for the models a trainer optimises, applied where it builds them: LoRA layers that add the adapters'
product in place (``fuse_lora_linears``, in place of ``rlhfkit.models.lora.prepare_adapters``). Like the kernel swaps
(``kernels.py``) it changes module classes in memory only and computes the same gradients; ``RLHFKIT_ACCEL=0``
turns it off.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from rlhfkit.accel.base import on, swap_classes
from rlhfkit.accel.onednn import fp32_cpu


# ---- LoRA layers: the adapters' product added in place ----------------------------------------------------------
# PEFT's LoRA linear computes ``base(x) + lora_B(lora_A(x)) * scaling``: besides the two small products, three
# full-size [rows, out] tensors per call (B's output, its scaled copy, the sum), each a pass over memory and
# each scaled or summed again in the backward. For one plain adapter (no dropout, no variant such as DoRA) the
# same sum is one ``addmm_`` onto the base layer's output: ``y += s * (x A^T) B^T``. The base layer's backward
# does not read its output, so adding in place leaves every gradient as it was (autograd's version check would
# stop a base layer that did).
def _lora_forward(cls: type) -> type:
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        active = self.active_adapters
        name = active[0] if len(active) == 1 else None
        if (
            args
            or kwargs
            or name not in self.lora_A
            or self.disable_adapters
            or self.merged
            or name in getattr(self, "lora_variant", {})
            or not isinstance(self.lora_dropout[name], nn.Identity)
            or not fp32_cpu(x, self.lora_A[name].weight, self.lora_B[name].weight)
        ):
            return cls.forward(self, x, *args, **kwargs)
        y = self.base_layer(x)
        a, b, scale = self.lora_A[name].weight, self.lora_B[name].weight, self.scaling[name]
        down = F.linear(x, a).reshape(-1, a.shape[0])
        if y._base is not None or not y.is_contiguous():  # a view (the base layer's padded rows): not in place
            return torch.addmm(y.reshape(-1, b.shape[0]), down, b.t(), alpha=scale).view(y.shape)
        y.view(-1, b.shape[0]).addmm_(down, b.t(), alpha=scale)
        return y

    return type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})


@functools.cache
def _lora_swaps() -> dict[type, type]:
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    return {Linear: _lora_forward(Linear)}


def fuse_lora_linears(model: nn.Module) -> int:
    """Give the PEFT LoRA linear layers of ``model`` the in-place adapter sum (fp32 on the CPU, one plain adapter;
    otherwise PEFT's own forward); returns how many. It stands in for ``rlhfkit.models.lora.prepare_adapters``."""
    return swap_classes(model, _lora_swaps()) if on("fused_lora") else 0
