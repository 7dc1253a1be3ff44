"""What every performance piece shares: the ``--accel auto|off`` switch and what ``auto`` means on a device
(``choices``), and swapping module classes (``swap_classes``, ``forward_intercepted``)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlhfkit.config.options import ACCEL_SWITCH, accel_mode_from_environment

if TYPE_CHECKING:  # torch is imported where it is used
    import torch
    from torch import nn

SWITCH = ACCEL_SWITCH
SKIP = "RLHFKIT_ACCEL_SKIP"
PIECES = (
    "fused_gelu",
    "swiglu_mlp",
    "onednn_linears",
    "packing",
    "lean_decode",
    "vocab_blocks",
    "kept_heap",
    "value_pass_apart",
    "fused_lora",
)
MODES = ("auto", "off")
_RUN_ON_CPU = {"forced": False}  # set by ``switch`` from a command's --cpu
# The command's options that steer the performance code (set by ``switched``; these defaults outside a command)
SETTINGS = {"pack_sequences": True, "compile_decode": False}
_SETTINGS = dict(SETTINGS)


def setting(name: str):
    """The running command's value of a performance option (``SETTINGS``: ``--pack-sequences``,
    ``--compile-decode``), or its default."""
    return _SETTINGS[name]


def enabled() -> bool:
    """False under ``--accel off`` (``RLHFKIT_ACCEL`` set to 0 / false / off / no)."""
    return accel_mode_from_environment() == "auto"


def skipped(piece: str) -> bool:
    """Whether ``RLHFKIT_ACCEL_SKIP`` leaves ``piece`` (one of ``PIECES``) off; an unknown name is an error."""
    if piece not in PIECES:
        raise ValueError(f"unknown performance piece {piece!r}; known: {', '.join(PIECES)}")
    named = {x.strip() for x in os.environ.get(SKIP, "").split(",") if x.strip()}
    unknown = named - set(PIECES)
    if unknown:
        raise ValueError(f"{SKIP} names unknown pieces {sorted(unknown)}; known: {', '.join(PIECES)}")
    return piece in named


def on(piece: str) -> bool:
    """The performance code is on (``enabled``) and ``RLHFKIT_ACCEL_SKIP`` does not leave ``piece`` off."""
    return enabled() and not skipped(piece)


def mode_from_environment() -> str:
    """``off`` when ``RLHFKIT_ACCEL`` turns the performance code off, else ``auto``: the default of ``--accel``."""
    return "auto" if enabled() else "off"


@contextlib.contextmanager
def switch(mode: str, cpu: bool = False, options: dict | None = None):
    """``RLHFKIT_ACCEL`` set from ``--accel MODE`` for this process and the processes it starts, the command's
    ``--cpu`` and its performance options (``SETTINGS``, read from ``options``) in force; all put back as they
    were afterwards."""
    if mode not in MODES:
        raise ValueError(f"accel must be one of {', '.join(MODES)}, got {mode!r}")
    before, forced, settings = os.environ.get(SWITCH), _RUN_ON_CPU["forced"], dict(_SETTINGS)
    os.environ[SWITCH] = "1" if mode == "auto" else "0"
    _RUN_ON_CPU["forced"] = cpu
    _SETTINGS.update({k: bool((options or {}).get(k, v)) for k, v in SETTINGS.items()})
    try:
        yield
    finally:
        _SETTINGS.update(settings)
        _RUN_ON_CPU["forced"] = forced
        if before is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = before


@dataclass(frozen=True)
class Choices:
    """What ``--accel auto`` turns on for one device; all False under ``--accel off``."""

    kernel_swaps: bool  # fused GELU / SwiGLU modules: the same function, any device
    onednn_linears: bool  # fp32 CPU linear layers through oneDNN
    packing: bool  # packed rows with a [R, 1, C, C] boolean block mask
    lean_decode: bool  # the decode step against preallocated key / value buffers
    vocab_blocks: bool  # log-probs and entropy a block of positions at a time, the LM head fused in
    kept_heap: bool  # glibc keeps freed memory between a step's phases
    value_pass_apart: bool  # the value model's forward and backward apart from the policy's


def choices(device: torch.device | str | None = None) -> Choices:
    """What ``auto`` means on ``device`` (None: the device this process computes on, see ``run_device``).

    On the CPU everything applies. On a GPU nothing fitted to the CPU does: no packing (a boolean block mask
    takes sdpa off its flash kernel, and the packing cost model was fitted to the CPU's sdpa), so batches stay
    padded on the fused attention kernels; no oneDNN layers, no kept heap, no value pass apart. The choices
    that hold on any device stay: the kernel swaps, the lean decode step, the block-wise vocabulary log-probs."""
    import torch

    if not enabled():
        return Choices(False, False, False, False, False, False, False)
    cpu = torch.device(device if device is not None else run_device()).type == "cpu"
    return Choices(
        kernel_swaps=True,
        onednn_linears=cpu and not skipped("onednn_linears"),
        packing=cpu and not skipped("packing"),
        lean_decode=not skipped("lean_decode"),
        vocab_blocks=not skipped("vocab_blocks"),
        kept_heap=cpu and not skipped("kept_heap"),
        value_pass_apart=cpu and not skipped("value_pass_apart"),
    )


def run_device() -> torch.device:
    """The device this process's models compute on: a GPU where one is present (and ``--cpu`` was not given)."""
    import torch

    if _RUN_ON_CPU["forced"] or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def forward_intercepted(*modules: nn.Module) -> bool:
    """Whether running these modules' parts directly (as the lean decode step and the packed LM head do)
    would skip something their ``forward`` does: a forward hook or pre-hook on one of them, a forward
    replaced on the instance (an autocast wrapper), or a hook registered on every module."""
    from torch import nn

    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in modules)


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
