"""fp32 linear layers on the CPU through oneDNN.

PyTorch's CPU matmuls in fp32 go to MKL's sgemm. On some CPUs and shapes (AMD's, and narrow inputs such as a
small model's vocabulary projection) oneDNN's fp32 kernels run the same products faster, in IEEE fp32 as well:
the results differ from MKL's only by the order of the float sums. Which one is faster depends on the CPU, the
thread count and the shape, so the choice is measured: once per process oneDNN is checked against ``F.linear``
for correctness (``onednn_ready``), and each layer shape of a loaded model is timed both ways at a training
batch's row count, forward alone and forward with backward (``onednn_faster``). A layer is swapped where oneDNN
wins either; it then takes oneDNN for a product without gradients (sampling, scoring, the reference) by the
first verdict and for one gradients will flow through by the second (``takes_onednn``). The verdicts are kept
in a small file per machine (``decisions_file``), so that later runs on the machine take the same kernels and a
seed gives the same numbers run after run. oneDNN builds a kernel per matrix shape and caches it, so the row count M
is padded up to one of 8 sizes per power of two (zero rows: exact, at most 1/8 more work) and a run meets a
bounded set of shapes.
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
from filelock import FileLock
from torch import nn

from rlhfkit.accel.base import choices, swap_classes
from rlhfkit.cache import cache_root

ONEDNN_MIN_MACS = 1 << 22  # smaller products stay on the default path (per-call overhead dominates there)
SELF_CHECK_SPEEDUP = 1.1  # oneDNN must beat F.linear by this factor at a layer's shape for the layer to use it
SELF_CHECK_MACS = 1 << 28  # rows of the timed product: about this many multiply-adds, between 256 and 2048 rows


def fp32_cpu(*tensors: torch.Tensor | None) -> bool:
    """Whether the given tensors (None skipped) are float32 on the CPU, with the CPU's autocast off: where the
    CPU-specific fp32 kernels apply."""
    return not torch.is_autocast_enabled("cpu") and all(
        t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors if t is not None
    )


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``rows`` rows (``x`` itself when it has them)."""
    if x.shape[0] == rows:
        return x
    out = x.new_empty(rows, *x.shape[1:])
    out[: x.shape[0]] = x
    out[x.shape[0] :].zero_()  # only the new rows: a zero-filled copy would write every row twice
    return out


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _agrees_with_default() -> bool:
    """oneDNN's product equals ``F.linear``'s to fp32 rounding on an odd-sized problem."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g) for s in ((70, 48), (40, 48), (40,)))
    return bool(torch.allclose(mm(x, w.t(), b), nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5))


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


_FASTER: dict[tuple[int, int, int, bool], bool] = {}  # (in, out features, threads, backward) -> oneDNN is faster


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


def _write_decision(key: str, faster: bool) -> bool:
    """Add one verdict to the file unless another process wrote one for ``key`` first, and return the verdict
    on file: every process then takes the same kernels for a shape (a resumed run computes what the run it
    continues computed). Read and rewritten under a lock, so concurrent writers lose no verdict; a read-only
    home is fine."""
    path = decisions_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(path.with_name(f"{path.name}.lock")):
            data = _read_decisions()
            if key in data:
                return data[key]
            data[key] = faster
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)
    except OSError:
        pass
    return faster


def _time_shape(in_features: int, out_features: int, rows: int, backward: bool) -> bool:
    """Whether a layer of this shape runs faster through oneDNN: its forward product, or with ``backward`` the three
    products of a training step, timed both ways, alternately, best of 5 each."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, in_features, generator=g).requires_grad_(backward)
    w = torch.randn(out_features, in_features, generator=g).requires_grad_(backward)
    grad = torch.randn(rows, out_features, generator=g)

    def onednn():
        y = _OneDNNMatmul.apply(x, w.t(), None)
        if backward:
            y.backward(grad)

    def default():
        y = nn.functional.linear(x, w)
        if backward:
            y.backward(grad)

    best = {onednn: float("inf"), default: float("inf")}
    with torch.set_grad_enabled(backward):
        for _ in range(2):  # the first calls build kernels
            onednn(), default()
        for _ in range(5):
            for fn in best:
                x.grad = w.grad = None
                start = time.perf_counter()
                fn()
                best[fn] = min(best[fn], time.perf_counter() - start)
    return best[onednn] * SELF_CHECK_SPEEDUP < best[default]


def onednn_faster(in_features: int, out_features: int, backward: bool = False) -> bool:
    """Whether oneDNN runs a layer ``[M, in] -> [M, out]`` at least ``SELF_CHECK_SPEEDUP`` times faster than
    ``F.linear`` here with this process's thread count: its forward product, or with ``backward`` forward and
    backward together. Timed once per machine, shape and kind, the verdict kept in ``decisions_file``."""
    threads = torch.get_num_threads()
    key = (in_features, out_features, threads, backward)
    if key not in _FASTER:
        rows = max(256, min(2048, SELF_CHECK_MACS // max(in_features * out_features, 1)))
        name = f"{in_features}x{out_features}@{threads} {'train' if backward else 'forward'}"
        if rows * in_features * out_features < ONEDNN_MIN_MACS:
            _FASTER[key] = False  # such products never take the oneDNN path
        elif (known := _read_decisions().get(name)) is not None:
            _FASTER[key] = known
        else:
            _FASTER[key] = _write_decision(name, _time_shape(in_features, out_features, rows, backward))
    return _FASTER[key]


def takes_onednn(layer: nn.Module, x: torch.Tensor | None = None) -> bool:
    """Whether a swapped layer's product (input ``x``; None: any) goes through oneDNN now: by its training
    verdict when gradients will flow through the product, else by its forward verdict."""
    training = torch.is_grad_enabled() and (x is None or x.requires_grad or layer.weight.requires_grad)
    return layer.onednn_training if training else layer.onednn_forward


def padded_rows(m: int) -> int:
    """``m`` rounded up to one of 8 sizes per power of two (multiples of 8 below 128)."""
    step = 8 if m <= 128 else 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def mm(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ b (+ bias)`` for 2-D ``x [M, K]`` and ``b [K, N]`` (any strides) with oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x, b.t(), bias, "none", [], "")


class _OneDNNMatmul(torch.autograd.Function):
    """``y = x @ b + bias`` on 2-D ``x [M, K]``, ``b [K, N]``, rows padded to ``padded_rows(M)``; its backward
    uses the same kernels (dx = g @ bᵀ, db = xᵀ @ g: the zero rows add nothing). The unpadded ``x`` is what
    is kept for backward (and padded again there): the padded copy would hold up to 1/8 more activation
    memory until backward."""

    @staticmethod
    def forward(ctx, x, b, bias):
        ctx.save_for_backward(x, b)
        ctx.has_bias = bias is not None
        return onednn_forward(x, b, bias)

    @staticmethod
    def backward(ctx, grad):
        x, b = ctx.saved_tensors
        dx, db = onednn_backward(grad, x, b, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        dbias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, db, dbias


def onednn_forward(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ b + bias`` for 2-D ``x [M, K]``, the rows padded to ``padded_rows(M)``."""
    m = x.shape[0]
    return mm(pad_rows(x, padded_rows(m)), b, bias)[:m]


def onednn_backward(grad: torch.Tensor, x: torch.Tensor, b: torch.Tensor, need_x: bool, need_b: bool) -> tuple:
    """``(g @ b^T, x^T @ g)`` of ``onednn_forward`` (None where not needed), padded the same way."""
    rows = padded_rows(x.shape[0])
    gp = pad_rows(grad.contiguous(), rows)
    dx = mm(gp, b.t())[: x.shape[0]] if need_x else None
    db = None
    if need_b:
        xp = pad_rows(x, rows)
        # b a transposed view (an nn.Linear's W^T): its gradient is made in W's layout, [N, K], and handed back
        # transposed, so the parameter's gradient needs no transposing copy; else in b's own layout
        db = mm(gp.t(), xp).t() if b.stride(0) == 1 and b.stride(1) != 1 else mm(xp.t(), gp)
    return dx, db


def onednn_applies(m: int, k: int, n: int, *tensors: torch.Tensor | None) -> bool:
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
    if not onednn_applies(m, k, n, x, b, bias):
        return None
    return _OneDNNMatmul.apply(x.reshape(m, k), b, bias).view(*x.shape[:-1], n)


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None, rows: int):
    """``x -> x W^T + bias`` for inputs of about ``rows`` rows, with ``W`` reordered once into oneDNN's own layout
    for that row count (a copy the size of ``W``): at a decode step's few rows the plain-layout product spends
    about as long reading and rearranging the weight as multiplying, and a layer's weight is read once per step.
    None where it does not apply: not fp32 on the
    CPU, oneDNN not ready, or no reorder in this torch build. Take it where the weight stays fixed over many
    calls (one sampling call) and read the layer again after it changes."""
    if not fp32_cpu(weight, bias) or not choices(weight.device).onednn_linears or not onednn_ready():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    bias = None if bias is None else bias.detach()

    def linear(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return linear


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` whose fp32 CPU products go through oneDNN (see ``linear_matmul``) where its verdicts say so
    (``takes_onednn``: ``onednn_forward`` without gradients, ``onednn_training`` with; both true unless measured)."""

    onednn_forward = True
    onednn_training = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear_matmul(x, self.weight.t(), self.bias) if takes_onednn(self, x) else None
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
        """GPT-2's ``Conv1D`` (``x @ W + b``, W ``[in, out]``) with fp32 CPU products through oneDNN (as
        ``OneDNNLinear``)."""

        onednn_forward = True
        onednn_training = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = linear_matmul(x, self.weight, self.bias) if takes_onednn(self, x) else None
            return super().forward(x) if y is None else y

    return Conv1D, OneDNNConv1D


def onednn_layers(model: nn.Module) -> bool:
    """Whether ``model`` has linear layers swapped to oneDNN (``fast_linears``) that run that way now: fp32
    weights on the CPU, autocast off, and the layer's verdict for a product with or without gradients, as
    gradients are now (``takes_onednn``)."""
    swapped = tuple(c for c in (OneDNNLinear, (_conv1d_swap() or (None, None))[1]) if c is not None)
    layers = [m for m in model.modules() if isinstance(m, swapped)]
    return bool(layers) and fp32_cpu(layers[0].weight) and any(takes_onednn(m) for m in layers)


def _features(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of an ``nn.Linear`` or a GPT-2 ``Conv1D`` (weight ``[in, out]``)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.weight.shape[0], module.weight.shape[1]


def fast_linears(model: nn.Module, measure: bool = True) -> int:
    """Give the ``nn.Linear`` and GPT-2 ``Conv1D`` layers of ``model`` the oneDNN fp32 CPU path: every one, or
    with ``measure`` those whose shape oneDNN runs faster here without or with gradients (``onednn_faster``),
    each taking it where it won. The modules keep their parameters, names and state dict; on other devices and
    dtypes they run as before. Returns how many."""
    swaps: dict[type, type] = {nn.Linear: OneDNNLinear}
    conv1d = _conv1d_swap()
    if conv1d is not None:
        swaps[conv1d[0]] = conv1d[1]

    def faster(module: nn.Module) -> bool:
        if not measure:
            return True
        forward, training = (onednn_faster(*_features(module), backward) for backward in (False, True))
        if forward or training:  # the verdicts go with the swapped layer
            module.onednn_forward, module.onednn_training = forward, training
        return forward or training

    return swap_classes(model, swaps, faster)
