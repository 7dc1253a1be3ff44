"""Performance code, kept apart from the algorithms, applied in a few visible places and behind one switch.

``--accel auto|off`` on every command (``RLHFKIT_ACCEL=0`` in the environment is ``off``; a flag given on the
command line, or ``accel=`` in the Python API, wins over the environment). ``off`` runs the plain transformers
and ``rlhfkit.ops`` code as written; ``auto`` turns on what ``choices(device)`` lists for the device a model
runs on, and trains the same up to float rounding. It is applied in two places:

- ``switched(mode, cpu, options)``, around every command that runs a model: under ``auto`` the faster
  implementations stand in for the plain functions of ``rlhfkit.models`` marked ``@replaceable``
  (``rlhfkit.models.fastpath``) for the length of the command, then the plain ones are put back:

  - each loaded model gets the kernel swaps (``prepare_model``): a fused tanh-GELU and a SwiGLU MLP that keeps
    two activations less for backward (``kernels.py``), and on the CPU fp32 linear layers through oneDNN where
    a self-check shows oneDNN equal to the default path and faster at that layer's shape (``onednn.py``);
  - LoRA adapters add their product onto the base layer's output in place (``trainable.py``);
  - teacher-forced passes run on packed rows with a block mask where a cost model says so (``packing.py``) and
    take log-probs and entropies a block of vocabulary positions at a time, the LM head fused in where it is a
    plain linear layer (``vocab.py``); both in ``passes.py``;
  - the sampler decodes against preallocated key / value buffers (``decode.py``).

  The command's ``--pack-sequences`` and ``--compile-decode`` are read here too (``setting``).
- ``online.OnlineAccel``, made by the online trainers: the kept heap on the CPU with glibc, and the value model's
  passes apart from the policy's (``--value-pass-apart``), one object with hooks the trainer calls.

Everything asks ``enabled()`` (and ``choices``) at the moment it runs. ``RLHFKIT_ACCEL_SKIP`` (a comma-separated
list of ``PIECES``) leaves single pieces off under ``auto``: it is how ``python -m bench accel_ab`` measures what
each one buys; it does not change what a piece computes. Nothing here runs at import time.
"""

from __future__ import annotations

import contextlib

from rlhfkit.accel import kernels, onednn, passes, trainable
from rlhfkit.accel.base import (
    MODES,
    PIECES,
    SKIP,
    SWITCH,
    Choices,
    choices,
    enabled,
    forward_intercepted,
    mode_from_environment,
    on,
    run_device,
    setting,
    skipped,
    switch,
)
from rlhfkit.accel.decode import lean_decoder
from rlhfkit.accel.vocab import release_blocks
from rlhfkit.models import fastpath, loading, lora, sampling

__all__ = [
    "MODES",
    "PIECES",
    "SKIP",
    "SWITCH",
    "Choices",
    "choices",
    "enabled",
    "forward_intercepted",
    "mode_from_environment",
    "on",
    "prepare_model",
    "run_device",
    "setting",
    "skipped",
    "switched",
]


def prepare_model(model) -> dict[str, int]:
    """Apply the kernel swaps to a freshly loaded model; returns how many modules each swap changed."""
    chosen = choices()
    swaps = chosen.kernel_swaps
    return {
        "fused_gelu": kernels.fuse_activations(model) if swaps and not skipped("fused_gelu") else 0,
        "swiglu_mlp": kernels.fuse_swiglu_mlps(model) if swaps and not skipped("swiglu_mlp") else 0,
        "onednn_linear": onednn.fast_linears(model) if chosen.onednn_linears and onednn.onednn_ready() else 0,
    }


def _decode_step(plain, model, prefill_cache, rows, capacity):
    return lean_decoder(model, prefill_cache, rows, capacity, setting("compile_decode"))


IMPLEMENTATIONS = {
    **passes.IMPLEMENTATIONS,
    loading.prepare_loaded: lambda plain, model: prepare_model(model),
    lora.prepare_adapters: lambda plain, model: trainable.fuse_lora_linears(model),
    sampling.decode_step: _decode_step,
}
"""The plain functions of ``rlhfkit.models`` and what stands in for each under ``--accel auto``."""


@contextlib.contextmanager
def switched(mode: str, cpu: bool = False, options: dict | None = None):
    """Run a command under ``--accel MODE``: ``RLHFKIT_ACCEL`` set for this process and the processes it starts,
    and under ``auto`` the faster implementations installed (``IMPLEMENTATIONS``); all put back as it was
    afterwards, the kept buffers freed. ``cpu``: the command runs on the CPU even where a GPU is present.
    ``options``: the command's options by name (``--pack-sequences``, ``--compile-decode`` are read)."""
    implementations = IMPLEMENTATIONS if mode == "auto" else {}
    try:
        with switch(mode, cpu, options), fastpath.installed(implementations):
            yield
    finally:
        passes.forget_packing()
        release_blocks()  # the LM head's kept blocks
