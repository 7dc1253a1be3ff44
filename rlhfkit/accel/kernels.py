"""Kernel swaps that compute the same function faster; ``rlhfkit.accel.prepare_model`` applies them.

Fused tanh-GELU: GPT-2-family models ("gelu_new") build ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``
out of ~8 separate tensor ops, each reading and writing the whole ``[B, L, 4H]`` activation and saving
inputs for backward. PyTorch has the same formula as one kernel (``F.gelu(x, approximate="tanh")``), ~3.5x
faster forward + backward at a small GPT-2's MLP shape on CPU. Outputs agree to float rounding (~2e-7).

oneDNN fp32 linears: see the section below. Both swaps change module classes in memory only; weights,
state-dict names and saved configs are untouched.
"""

from __future__ import annotations

import functools
import time

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


# ---- fp32 linear layers on CPU through oneDNN ----------------------------------------------------------------
# PyTorch's CPU matmuls in fp32 go to MKL's sgemm. On CPUs where MKL does not pick its AVX-512 code (AMD's,
# for one) oneDNN's fp32 kernels run the same products about twice as fast, in IEEE fp32 as well: the
# results differ from MKL's only by the order of the float sums. Where MKL is the faster one, the start-up
# self-check (``onednn_ready``) keeps the default path. oneDNN builds a kernel per matrix shape and caches it
# (~1 MB each), so the row count M is padded up to one of 8 sizes per power of two (zero rows: exact, at most
# 1/8 more work) and a run meets a bounded set of shapes.
ONEDNN_MIN_MACS = 1 << 22  # smaller products stay on the default path (per-call overhead dominates there)
SELF_CHECK_SPEEDUP = 1.1  # oneDNN must beat F.linear by this factor at the self-check's shape to be used


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _best_time(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _self_check() -> bool:
    """oneDNN's product equals ``F.linear``'s (to fp32 rounding) and is faster at a transformer-sized shape."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g) for s in ((70, 48), (40, 48), (40,)))
    if not torch.allclose(_mm(x, w.t(), b), nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5):
        return False
    x, w = torch.randn(512, 256, generator=g), torch.randn(1024, 256, generator=g)  # 134M multiply-adds
    wt = w.t()
    for _ in range(2):  # warm-up: the first calls build kernels
        _mm(x, wt)
        nn.functional.linear(x, w)
    onednn = _best_time(lambda: _mm(x, wt))
    default = _best_time(lambda: nn.functional.linear(x, w))
    return onednn * SELF_CHECK_SPEEDUP < default


_ONEDNN: bool | None = None  # decided once per process, on first use


def onednn_ready() -> bool:
    """Whether fp32 CPU linears go through oneDNN in this process: available, correct and faster here."""
    global _ONEDNN
    if _ONEDNN is None:
        try:
            _ONEDNN = _onednn_available() and _self_check()
        except RuntimeError:
            _ONEDNN = False
    return _ONEDNN


def padded_rows(m: int) -> int:
    """``m`` rounded up to one of 8 sizes per power of two (multiples of 8 below 128)."""
    step = 8 if m <= 128 else 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def _mm(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ b (+ bias)`` for 2-D ``x [M, K]`` and ``b [K, N]`` (any strides) with oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x, b.t(), bias, "none", [], "")


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    out = x.new_zeros(rows, x.shape[1])
    out[: x.shape[0]] = x
    return out


class _OneDNNMatmul(torch.autograd.Function):
    """``y = x @ b + bias`` on 2-D ``x [M, K]``, ``b [K, N]``, rows padded to ``padded_rows(M)``; its backward
    uses the same kernels (dx = g @ bᵀ, db = xᵀ @ g: the zero rows add nothing). The unpadded ``x`` is what
    is kept for backward (and padded again there): the padded copy would hold up to 1/8 more activation
    memory until backward (+14 MB of 160 on the small benchmark model's forward)."""

    @staticmethod
    def forward(ctx, x, b, bias):
        m, rows = x.shape[0], padded_rows(x.shape[0])
        ctx.save_for_backward(x, b)
        ctx.rows, ctx.has_bias = rows, bias is not None
        return _mm(_pad_rows(x, rows), b, bias)[:m]

    @staticmethod
    def backward(ctx, grad):
        x, b = ctx.saved_tensors
        gp = _pad_rows(grad.contiguous(), ctx.rows)
        dx = _mm(gp, b.t())[: x.shape[0]] if ctx.needs_input_grad[0] else None
        db = _mm(_pad_rows(x, ctx.rows).t(), gp) if ctx.needs_input_grad[1] else None
        dbias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, db, dbias


def linear_matmul(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None):
    """``x @ b + bias`` over the last dim of ``x`` (``b [K, N]``) through oneDNN when that applies here (CPU,
    fp32, no autocast, a product of at least ONEDNN_MIN_MACS), else None (the caller's default path)."""
    if (
        x.device.type != "cpu"
        or x.dtype != torch.float32
        or b.dtype != torch.float32
        or (bias is not None and bias.dtype != torch.float32)
        or torch.is_autocast_enabled("cpu")
    ):
        return None
    k, n = b.shape
    m = x.numel() // k if k else 0
    if m * k * n < ONEDNN_MIN_MACS or not onednn_ready():
        return None
    return _OneDNNMatmul.apply(x.reshape(m, k), b, bias).view(*x.shape[:-1], n)


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` whose fp32 CPU products go through oneDNN (see ``linear_matmul``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear_matmul(x, self.weight.t(), self.bias)
        return super().forward(x) if y is None else y


@functools.cache
def _conv1d_swap() -> tuple[type, type] | None:
    """(GPT-2's ``Conv1D``, its oneDNN subclass), built on first use so importing this module imports no
    transformers."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover
        return None

    class OneDNNConv1D(Conv1D):
        """GPT-2's ``Conv1D`` (``x @ W + b``, W ``[in, out]``) with fp32 CPU products through oneDNN."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = linear_matmul(x, self.weight, self.bias)
            return super().forward(x) if y is None else y

    return Conv1D, OneDNNConv1D


def fast_linears(model: nn.Module) -> int:
    """Give every ``nn.Linear`` and GPT-2 ``Conv1D`` of ``model`` the oneDNN fp32 CPU path (the modules keep
    their parameters, names and state dict; on other devices and dtypes they run as before). Returns how many."""
    swaps: dict[type, type] = {nn.Linear: OneDNNLinear}
    conv1d = _conv1d_swap()
    if conv1d is not None:
        swaps[conv1d[0]] = conv1d[1]
    changed = 0
    for module in model.modules():
        new = swaps.get(type(module))
        if new is not None:
            module.__class__ = new
            changed += 1
    return changed
