"""Kernel swaps that compute the same function; ``rlhfkit.accel.prepare_model`` applies them.

Fused tanh-GELU: GPT-2-family models ("gelu_new") build ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``
out of ~8 separate tensor ops, each reading and writing the whole ``[B, L, 4H]`` activation and saving
inputs for backward. PyTorch has the same formula as one kernel (``F.gelu(x, approximate="tanh")``); outputs
agree to float rounding.

SwiGLU MLP: the Llama-family MLP ``down(silu(gate(x)) * up(x))`` keeps four ``[rows, intermediate]`` tensors for
backward (``gate(x)``, ``silu(gate(x))``, ``up(x)`` and the product, ``down``'s input); the swapped MLP keeps
``gate(x)`` and ``up(x)`` only and makes the SiLU and the product again in its backward (two elementwise passes),
with the same float operations as autograd's (bitwise equal outputs and gradients): ``swiglu`` for the product,
``swiglu_down`` for the product and a plain ``down`` projection together: two ``[rows, intermediate]``
activations per layer fewer kept for backward.

oneDNN fp32 linears: ``onednn.py``. Every swap changes module classes in memory only; weights, state-dict names
and saved configs are untouched. The swap for the models a trainer optimises is in ``trainable.py``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from rlhfkit.accel.base import forward_intercepted, swap_classes
from rlhfkit.accel.onednn import OneDNNLinear, onednn_applies, onednn_backward, onednn_forward, takes_onednn


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


def _family_swaps(suffix: str, subclass) -> dict[type, type]:
    """{transformers' ``<Family><suffix>`` class: ``subclass(it)``} for Llama, Qwen2, Qwen3 and Mistral (the
    families whose MLP the swap below reproduces), skipping a family this transformers lacks."""
    import importlib

    swaps: dict[type, type] = {}
    for family, name in (("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("mistral", "Mistral")):
        try:
            cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name + suffix)
        except (ImportError, AttributeError):  # pragma: no cover - a transformers without the family
            continue
        swaps[cls] = subclass(cls)
    return swaps


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate).mul_(up)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        return _swiglu_grads(grad, gate, up, ctx.needs_input_grad[0], ctx.needs_input_grad[1])


def _swiglu_grads(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, need_gate: bool, need_up: bool):
    """Autograd's own backward of ``silu(gate) * up``: the product's two gradients, then SiLU's (None where not
    needed)."""
    d_up = grad * F.silu(gate) if need_up else None
    d_gate = torch.ops.aten.silu_backward(grad * up, gate) if need_gate else None
    return d_gate, d_up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, keeping only ``gate`` and ``up`` for backward (see the module's docstring)."""
    if gate.shape != up.shape:
        return F.silu(gate) * up
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SwiGLU.apply(gate, up)
    return F.silu(gate).mul_(up)


def _silu_classes() -> tuple[type, ...]:
    try:
        from transformers.activations import SiLUActivation
    except ImportError:  # pragma: no cover - a transformers that names it nn.SiLU only
        return (nn.SiLU,)
    return (nn.SiLU, SiLUActivation)


class _SwiGLUDown(torch.autograd.Function):
    """``down(silu(gate) * up)`` for a plain linear ``down`` (weight ``[N, K]``), keeping ``gate`` and ``up`` (and
    the weight) for backward: the product ``h = silu(gate) * up``, which the weight's gradient needs, is made
    again there, with the same float operations. The linear runs as the layer itself would (``onednn``: the
    oneDNN path of ``linear_matmul``; else ``F.linear``), and its gradients are the ones autograd would give it."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias, onednn: bool):
        h = F.silu(gate).mul_(up)
        ctx.save_for_backward(gate, up, weight)
        ctx.onednn, ctx.has_bias = onednn, bias is not None
        if not onednn:
            return F.linear(h, weight, bias)
        n, k = weight.shape
        return onednn_forward(h.reshape(-1, k), weight.t(), bias).view(*h.shape[:-1], n)

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        h = F.silu(gate).mul_(up)
        n, k = weight.shape
        g, x = grad.reshape(-1, n), h.reshape(-1, k)
        if ctx.onednn:
            dx, dwt = onednn_backward(g, x, weight.t(), True, ctx.needs_input_grad[2])
            dw = None if dwt is None else dwt.t()
        else:  # autograd's products for a linear of a row-major input: g W and g^T x
            dx = g.mm(weight)
            dw = g.t().mm(x) if ctx.needs_input_grad[2] else None
        dbias = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None
        d_gate, d_up = _swiglu_grads(dx.view(h.shape), gate, up, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return d_gate, d_up, dw, dbias, None


def swiglu_down(gate: torch.Tensor, up: torch.Tensor, down: nn.Module) -> torch.Tensor:
    """``down(swiglu(gate, up))``; where autograd records it and ``down`` is a plain ``nn.Linear`` (or its oneDNN
    swap) of ``gate``'s dtype, outside autocast and ``torch.compile``, through ``_SwiGLUDown``, which keeps neither
    ``silu(gate)`` nor the product (``down``'s input) for backward (see the module's docstring)."""
    records = torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad or down.weight.requires_grad)
    if (
        not records
        or type(down) not in (nn.Linear, OneDNNLinear)
        or forward_intercepted(down)
        or gate.shape != up.shape
        or gate.dtype != down.weight.dtype
        or torch.is_autocast_enabled(gate.device.type)
        or torch.compiler.is_compiling()
    ):
        return down(swiglu(gate, up))
    n, k = down.weight.shape
    onednn = isinstance(down, OneDNNLinear) and takes_onednn(down, gate)
    onednn = onednn and onednn_applies(gate.numel() // k, k, n, gate, down.weight, down.bias)
    return _SwiGLUDown.apply(gate, up, down.weight, down.bias, onednn)


def _swiglu_mlp(cls: type) -> type:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if forward_intercepted(self.act_fn):
            return cls.forward(self, x)
        return swiglu_down(self.gate_proj(x), self.up_proj(x), self.down_proj)

    return type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})


@functools.cache
def _mlp_swaps() -> dict[type, type]:
    """{transformers' gated MLP class: its ``swiglu`` subclass} for the families whose MLP is
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""
    return _family_swaps("MLP", _swiglu_mlp)


def fuse_swiglu_mlps(model: nn.Module) -> int:
    """Give the gated MLPs of ``model`` whose activation is SiLU the ``swiglu`` product (see the module's
    docstring); returns how many."""
    silu = _silu_classes()
    return swap_classes(model, _mlp_swaps(), lambda m: type(getattr(m, "act_fn", None)) in silu)
