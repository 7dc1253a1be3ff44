"""Kernel swaps that compute the same function faster; ``rlhfkit.accel.prepare_model`` applies them.

Fused tanh-GELU: GPT-2-family models ("gelu_new") build ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``
out of ~8 separate tensor ops, each reading and writing the whole ``[B, L, 4H]`` activation and saving
inputs for backward. PyTorch has the same formula as one kernel (``F.gelu(x, approximate="tanh")``), ~3.5x
faster forward + backward at a small GPT-2's MLP shape on CPU. Outputs agree to float rounding (~2e-7).

Fused RMSNorm: Llama / Qwen2 / Qwen3 / Mistral RMSNorm modules normalise with ~6 separate ops in fp32;
``F.rms_norm`` is one kernel with the same float operations (bitwise equal outputs and gradients in fp32 on the
CPU), ~2x faster forward + backward at SmolLM2's shape.

SwiGLU MLP: the Llama-family MLP ``down(silu(gate(x)) * up(x))`` keeps four ``[rows, intermediate]`` tensors for
backward (``gate(x)``, ``silu(gate(x))``, ``up(x)`` and the product, ``down``'s input); the swapped MLP keeps
``gate(x)`` and ``up(x)`` only and makes the SiLU and the product again in its backward (two elementwise passes),
with the same float operations as autograd's (bitwise equal outputs and gradients): ``swiglu`` for the product,
``swiglu_down`` for the product and a plain ``down`` projection together. At SmolLM2's 1536-wide MLP that is
12 KB per token and layer (~280 MB for a PPO batch of 780 tokens).

oneDNN fp32 linears: see the section below. Every swap changes module classes in memory only; weights, state-dict
names and saved configs are untouched. The swaps for the models a trainer optimises are in ``trainable.py``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rlhfkit.accel import forward_intercepted
from rlhfkit.cache import cache_root
from rlhfkit.ops.vocab_chunks import Product, fp32_cpu, pad_rows


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


def swap_classes(model: nn.Module, swaps: dict[type, type], where=lambda module: True) -> int:
    """Give each module of ``model`` whose exact class is a key of ``swaps`` (and that ``where`` accepts) the
    class it maps to: a subclass with the same parameters and state dict; returns how many changed."""
    changed = 0
    for module in model.modules():
        new = swaps.get(type(module))
        if new is not None and where(module):
            module.__class__ = new
            changed += 1
    return changed


def _fused_rms_norm(cls: type) -> type:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fp32_cpu(x, self.weight):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)
        return cls.forward(self, x)

    return type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})


def _family_swaps(suffix: str, subclass) -> dict[type, type]:
    """{transformers' ``<Family><suffix>`` class: ``subclass(it)``} for Llama, Qwen2, Qwen3 and Mistral (the
    families whose norm and MLP the swaps below reproduce), skipping a family this transformers lacks."""
    import importlib

    swaps: dict[type, type] = {}
    for family, name in (("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("mistral", "Mistral")):
        try:
            cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name + suffix)
        except (ImportError, AttributeError):  # pragma: no cover - a transformers without the family
            continue
        swaps[cls] = subclass(cls)
    return swaps


@functools.cache
def _rms_norm_swaps() -> dict[type, type]:
    """{transformers' RMSNorm class: its fused subclass} for the model families whose norm is
    ``weight * (x * rsqrt(mean(x^2) + eps))`` computed in fp32 (Gemma's ``1 + weight`` is not one of them)."""
    return _family_swaps("RMSNorm", _fused_rms_norm)


def fuse_rms_norms(model: nn.Module) -> int:
    """Give the RMSNorm modules of ``model`` the fused fp32 CPU kernel (see the module's docstring); returns how
    many. Other dtypes and devices run the model's own forward."""
    return swap_classes(model, _rms_norm_swaps(), lambda m: isinstance(getattr(m, "variance_epsilon", None), float))


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
        return _onednn_forward(h.reshape(-1, k), weight.t(), bias).view(*h.shape[:-1], n)

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        h = F.silu(gate).mul_(up)
        n, k = weight.shape
        g, x = grad.reshape(-1, n), h.reshape(-1, k)
        if ctx.onednn:
            dx, dwt = _onednn_backward(g, x, weight.t(), True, ctx.needs_input_grad[2])
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
    onednn = isinstance(down, OneDNNLinear) and _onednn_applies(gate.numel() // k, k, n, gate, down.weight, down.bias)
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


# ---- fp32 linear layers on CPU through oneDNN ----------------------------------------------------------------
# PyTorch's CPU matmuls in fp32 go to MKL's sgemm. On some CPUs and shapes (AMD's, and narrow inputs such as a
# small model's vocabulary projection) oneDNN's fp32 kernels run the same products up to about twice as fast,
# in IEEE fp32 as well: the results differ from MKL's only by the order of the float sums. Which one is faster
# depends on the CPU, the thread count and the shape, so the choice is measured: once per process oneDNN is
# checked against ``F.linear`` for correctness (``onednn_ready``), and each layer shape of a loaded model is
# timed both ways (``onednn_faster``); only layers whose shape oneDNN runs faster are swapped. The timings'
# verdicts are kept in a small file per machine (``decisions_file``), so that later runs on the machine take
# the same kernels and a seed gives the same numbers run after run. oneDNN builds a
# kernel per matrix shape and caches it (~1 MB each), so the row count M is padded up to one of 8 sizes per
# power of two (zero rows: exact, at most 1/8 more work) and a run meets a bounded set of shapes.
ONEDNN_MIN_MACS = 1 << 22  # smaller products stay on the default path (per-call overhead dominates there)
SELF_CHECK_SPEEDUP = 1.1  # oneDNN must beat F.linear by this factor at a layer's shape for the layer to use it
SELF_CHECK_MACS = 1 << 25  # rows of the timed product: about this many multiply-adds, between 64 and 1024 rows


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _best_time(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _agrees_with_default() -> bool:
    """oneDNN's product equals ``F.linear``'s to fp32 rounding on an odd-sized problem."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g) for s in ((70, 48), (40, 48), (40,)))
    return bool(torch.allclose(_mm(x, w.t(), b), nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5))


_ONEDNN: bool | None = None  # decided once per process, on first use


def onednn_ready() -> bool:
    """Whether the oneDNN fp32 linear is usable in this process: available and agreeing with ``F.linear``."""
    global _ONEDNN
    if _ONEDNN is None:
        try:
            _ONEDNN = _onednn_available() and _agrees_with_default()
        except RuntimeError:
            _ONEDNN = False
    return _ONEDNN


_FASTER: dict[tuple[int, int, int], bool] = {}  # (in features, out features, threads) -> oneDNN is faster


def decisions_file() -> Path:
    """Where the timings' verdicts are kept: ``$RLHFKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlhfkit``, else
    ``~/.cache/rlhfkit``; one file per CPU (model name and vector instruction sets: one model name covers
    machines with and without AVX-512) and torch version."""
    machine = f"{_cpu_model()}-{_cpu_isa()}-torch-{torch.__version__}"
    return cache_root() / f"onednn-linear-{hashlib.sha1(machine.encode()).hexdigest()[:12]}.json"


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _cpu_isa() -> str:
    """torch's CPU kernel level here (e.g. AVX2, AVX512) and the CPU's AVX-512 / AMX flags."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wide = sorted(f for f in flags if f.startswith(("avx512", "amx")))
    return "+".join([torch.backends.cpu.get_cpu_capability(), *wide])


def _read_decisions() -> dict[str, bool]:
    try:
        data = json.loads(decisions_file().read_text())
        return {str(k): bool(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _write_decision(key: str, faster: bool) -> None:
    """Add one verdict to the file (written to a temporary name, then renamed); a read-only home is fine."""
    path = decisions_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**_read_decisions(), key: faster}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


def _time_shape(in_features: int, out_features: int, rows: int) -> bool:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, in_features, generator=g), torch.randn(out_features, in_features, generator=g)
    wt = w.t()
    for _ in range(2):  # the first calls build kernels
        _mm(x, wt)
        nn.functional.linear(x, w)
    onednn = _best_time(lambda: _mm(x, wt))
    default = _best_time(lambda: nn.functional.linear(x, w))
    return onednn * SELF_CHECK_SPEEDUP < default


def onednn_faster(in_features: int, out_features: int) -> bool:
    """Whether oneDNN runs ``[M, in] @ [in, out]`` at least ``SELF_CHECK_SPEEDUP`` times faster than ``F.linear``
    here with this process's thread count: timed once per machine and shape (best of 5 after a warm-up), the
    verdict kept in ``decisions_file``."""
    threads = torch.get_num_threads()
    key = (in_features, out_features, threads)
    if key not in _FASTER:
        rows = max(64, min(1024, SELF_CHECK_MACS // max(in_features * out_features, 1)))
        name = f"{in_features}x{out_features}@{threads}"
        if rows * in_features * out_features < ONEDNN_MIN_MACS:
            _FASTER[key] = False  # such products never take the oneDNN path
        elif (known := _read_decisions().get(name)) is not None:
            _FASTER[key] = known
        else:
            _FASTER[key] = _time_shape(in_features, out_features, rows)
            _write_decision(name, _FASTER[key])
    return _FASTER[key]


def padded_rows(m: int) -> int:
    """``m`` rounded up to one of 8 sizes per power of two (multiples of 8 below 128)."""
    step = 8 if m <= 128 else 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def _mm(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ b (+ bias)`` for 2-D ``x [M, K]`` and ``b [K, N]`` (any strides) with oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x, b.t(), bias, "none", [], "")


class _OneDNNMatmul(torch.autograd.Function):
    """``y = x @ b + bias`` on 2-D ``x [M, K]``, ``b [K, N]``, rows padded to ``padded_rows(M)``; its backward
    uses the same kernels (dx = g @ bᵀ, db = xᵀ @ g: the zero rows add nothing). The unpadded ``x`` is what
    is kept for backward (and padded again there): the padded copy would hold up to 1/8 more activation
    memory until backward (+14 MB of 160 on the small benchmark model's forward)."""

    @staticmethod
    def forward(ctx, x, b, bias):
        ctx.save_for_backward(x, b)
        ctx.has_bias = bias is not None
        return _onednn_forward(x, b, bias)

    @staticmethod
    def backward(ctx, grad):
        x, b = ctx.saved_tensors
        dx, db = _onednn_backward(grad, x, b, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        dbias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, db, dbias


def _onednn_forward(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ b + bias`` for 2-D ``x [M, K]``, the rows padded to ``padded_rows(M)``."""
    m = x.shape[0]
    return _mm(pad_rows(x, padded_rows(m)), b, bias)[:m]


def _onednn_backward(grad: torch.Tensor, x: torch.Tensor, b: torch.Tensor, need_x: bool, need_b: bool) -> tuple:
    """``(g @ b^T, x^T @ g)`` of ``_onednn_forward`` (None where not needed), padded the same way."""
    rows = padded_rows(x.shape[0])
    gp = pad_rows(grad.contiguous(), rows)
    dx = _mm(gp, b.t())[: x.shape[0]] if need_x else None
    db = None
    if need_b:
        xp = pad_rows(x, rows)
        # b a transposed view (an nn.Linear's W^T): its gradient is made in W's layout, [N, K], and handed back
        # transposed, so the parameter's gradient needs no transposing copy; else in b's own layout
        db = _mm(gp.t(), xp).t() if b.stride(0) == 1 and b.stride(1) != 1 else _mm(xp.t(), gp)
    return dx, db


def _onednn_applies(m: int, k: int, n: int, *tensors: torch.Tensor | None) -> bool:
    """Whether an ``[m, k] @ [k, n]`` product of ``tensors`` takes the oneDNN path (see ``linear_matmul``)."""
    if torch.compiler.is_compiling() or not fp32_cpu(*tensors):
        return False
    return m * k * n >= ONEDNN_MIN_MACS and onednn_ready()


def linear_matmul(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None):
    """``x @ b + bias`` over the last dim of ``x`` (``b [K, N]``) through oneDNN when that applies here (CPU,
    fp32, no autocast, a product of at least ONEDNN_MIN_MACS, not inside a ``torch.compile`` trace: Inductor
    lowers oneDNN's linear only for frozen weights, and picks its own kernels), else None (the caller's default
    path)."""
    k, n = b.shape
    m = x.numel() // k if k else 0
    if not _onednn_applies(m, k, n, x, b, bias):
        return None
    return _OneDNNMatmul.apply(x.reshape(m, k), b, bias).view(*x.shape[:-1], n)


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None, rows: int):
    """``x -> x W^T + bias`` for inputs of about ``rows`` rows, with ``W`` reordered once into oneDNN's own layout
    for that row count (a copy the size of ``W``): at a decode step's few rows the plain-layout product spends
    about as long reading and rearranging the weight as multiplying, and a layer's weight is read once per step
    (SmolLM2's projections at 16 rows: 1.4-1.9x faster a call). None where it does not apply: not fp32 on the
    CPU, oneDNN not ready, or no reorder in this torch build. Take it where the weight stays fixed over many
    calls (one sampling call) and read the layer again after it changes."""
    if not fp32_cpu(weight, bias) or not onednn_ready():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    bias = None if bias is None else bias.detach()

    def linear(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return linear


class HeadProduct(Product):
    """The LM head's block products for ``rlhfkit.ops.vocab_chunks.head_logprobs`` through oneDNN: ``[rows, H] @
    [H, V]`` for the logits and ``[rows, V] @ [V, H]`` for the gradient of the hidden states. At a real vocabulary
    oneDNN runs these about twice as fast as ``torch.mm`` here; each block is padded to ``padded_rows`` rows so a
    run meets a bounded set of kernel shapes (one per row count, kept by oneDNN)."""

    def mm(self, a: torch.Tensor, b: torch.Tensor, slot: int) -> torch.Tensor:
        return _mm(a, b)

    def rows(self, m: int) -> int:
        return padded_rows(m)


def head_product(head: nn.Module) -> HeadProduct | None:
    """``HeadProduct`` for an LM head whose fp32 CPU products take oneDNN here (a layer ``fast_linears`` swapped:
    oneDNN measured faster at its shape); else None (the default products)."""
    if isinstance(head, OneDNNLinear) and head.bias is None and onednn_ready():
        return HeadProduct()
    return None


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


def onednn_layers(model: nn.Module) -> bool:
    """Whether ``model`` has linear layers swapped to oneDNN (``fast_linears``) and runs them that way now: fp32
    weights on the CPU, autocast off."""
    swapped = tuple(c for c in (OneDNNLinear, (_conv1d_swap() or (None, None))[1]) if c is not None)
    for module in model.modules():
        if isinstance(module, swapped):
            return fp32_cpu(module.weight)
    return False


def _features(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of an ``nn.Linear`` or a GPT-2 ``Conv1D`` (weight ``[in, out]``)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.weight.shape[0], module.weight.shape[1]


def fast_linears(model: nn.Module, measure: bool = True) -> int:
    """Give the ``nn.Linear`` and GPT-2 ``Conv1D`` layers of ``model`` the oneDNN fp32 CPU path: every one, or
    with ``measure`` those whose shape oneDNN runs faster here (``onednn_faster``). The modules keep their
    parameters, names and state dict; on other devices and dtypes they run as before. Returns how many."""
    swaps: dict[type, type] = {nn.Linear: OneDNNLinear}
    conv1d = _conv1d_swap()
    if conv1d is not None:
        swaps[conv1d[0]] = conv1d[1]
    return swap_classes(model, swaps, lambda m: not measure or onednn_faster(*_features(m)))
