"""Performance code, kept apart from the algorithms, applied in a few visible places and behind one switch.

``--accel auto|off`` on every command (``RLHFKIT_ACCEL=0`` in the environment is ``off``; a flag given on the
command line, or ``accel=`` in the Python API, wins over the environment). ``off`` runs plain transformers and
``rlhfkit.ops``; ``auto`` turns on what ``choices(device)`` lists for the device a model runs on, and trains the
same up to float rounding. Everything here asks ``enabled()`` (and ``choices``) at the moment it runs:

- ``prepare_model(model)``, called by every model loader: kernel swaps that compute the same function faster
  or in less memory (``kernels.py``: a fused tanh-GELU, a SwiGLU MLP that keeps two activations less for
  backward) and, on the CPU, fp32 linear layers through oneDNN where a self-check shows oneDNN equal to the
  default path and faster at that layer's shape (``onednn.py``).
- ``trainable.fuse_lora_linears(model)``: a LoRA adapter's product added onto its base layer's output in
  place.
- Sequence packing (``packing.py``, on the CPU): teacher-forced passes on packed rows with a block mask,
  chosen per batch by a cost model.
- The lean decode step (``decode.py``): sampling against preallocated key / value buffers.
- Block-wise vocabulary log-probs (``vocab.py``): log-probs and entropy a block of positions at a time, the
  LM head fused in where it is a plain linear layer.
- The online trainers' kept heap (on the CPU with glibc) and the value model's passes apart from the policy's
  (``--value-pass-apart``): one object with hooks the trainer calls (``online.py``).

``RLHFKIT_ACCEL_SKIP`` (a comma-separated list of ``PIECES``) leaves single pieces off under ``auto``: it is how
``bench/accel_ab.py`` measures what each one buys; it does not change what a piece computes.

Nothing here runs at import time.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the CLI reads the switch without importing torch
    import torch
    from torch import nn

SWITCH = "RLHFKIT_ACCEL"
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
_OFF = ("0", "false", "off", "no")
_RUN_ON_CPU = {"forced": False}  # set by ``switched`` from a command's --cpu


def enabled() -> bool:
    """False under ``--accel off`` (``RLHFKIT_ACCEL`` set to 0 / false / off / no)."""
    return os.environ.get(SWITCH, "1").strip().lower() not in _OFF


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
def switched(mode: str, cpu: bool = False):
    """Run a command under ``--accel MODE``: ``RLHFKIT_ACCEL`` set for this process and the processes it starts,
    and put back as it was afterwards. ``cpu``: the command runs on the CPU even where a GPU is present."""
    if mode not in MODES:
        raise ValueError(f"accel must be one of {', '.join(MODES)}, got {mode!r}")
    before, forced = os.environ.get(SWITCH), _RUN_ON_CPU["forced"]
    os.environ[SWITCH] = "1" if mode == "auto" else "0"
    _RUN_ON_CPU["forced"] = cpu
    try:
        yield
    finally:
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


def prepare_model(model: nn.Module) -> dict[str, int]:
    """Apply the kernel swaps to a freshly loaded model; returns how many modules each swap changed."""
    from rlhfkit.accel import kernels, onednn

    chosen = choices()
    swaps = chosen.kernel_swaps
    return {
        "fused_gelu": kernels.fuse_activations(model) if swaps and not skipped("fused_gelu") else 0,
        "swiglu_mlp": kernels.fuse_swiglu_mlps(model) if swaps and not skipped("swiglu_mlp") else 0,
        "onednn_linear": onednn.fast_linears(model) if chosen.onednn_linears and onednn.onednn_ready() else 0,
    }
