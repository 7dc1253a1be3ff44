"""Performance code, kept apart from the algorithms and applied in a few visible places.

- ``prepare_model(model)``, called by every model loader: swaps in kernels that compute the same function
  faster or in less memory (``kernels.py``): a fused tanh-GELU, a fused fp32 RMSNorm, a SwiGLU MLP that keeps
  two activations less for backward, and fp32 CPU linear layers through oneDNN where a self-check shows oneDNN
  equal to the default path on this CPU and faster at that layer's shape (timed once per machine, the verdicts
  kept under ``~/.cache/rlhfkit``).
- ``trainable.row_grad_embedding(model)``, called where a trainer builds its optimizer: a tied input embedding
  adds its rows' gradient into the weight's ``.grad`` in place instead of building a dense one.
- ``trainable.fuse_lora_linears(model)``, called where LoRA adapters are added (``rlhfkit.models.lora``): a plain
  adapter's product is added onto its base layer's output in place.
- Sequence packing (``packing.py``): teacher-forced passes on packed rows instead of padded ones, chosen
  per batch by a cost model; on by default, ``--pack-sequences false`` turns it off. A packed pass's attention
  runs by segments where that is cheaper (``segments.py``).
- ``rlhfkit.training.runtime.keep_freed_memory()``, called by the online trainers on the CPU: glibc's malloc keeps
  freed memory for the next tensors instead of returning it between a step's phases (each returned page costs a
  page fault when touched again).
- ``RLHFKIT_ACCEL=0`` in the environment turns every swap, the lean decode step, the segment attention and the
  kept heap memory off.

Nothing here runs at import time.
"""

from __future__ import annotations

import os

from torch import nn

SWITCH = "RLHFKIT_ACCEL"


def enabled() -> bool:
    """False when ``RLHFKIT_ACCEL`` is set to 0 / false / off / no."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def forward_intercepted(*modules: nn.Module) -> bool:
    """Whether running these modules' parts directly (as the lean decode step and the packed LM head do)
    would skip something their ``forward`` does: a forward hook or pre-hook on one of them, a forward
    replaced on the instance (an autocast wrapper), or a hook registered on every module."""
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in modules)


def prepare_model(model: nn.Module) -> dict[str, int]:
    """Apply the kernel swaps to a freshly loaded model; returns how many modules each swap changed."""
    from rlhfkit.accel import kernels

    if not enabled():
        return {"fused_gelu": 0, "fused_rms_norm": 0, "swiglu_mlp": 0, "onednn_linear": 0}
    return {
        "fused_gelu": kernels.fuse_activations(model),
        "fused_rms_norm": kernels.fuse_rms_norms(model),
        "swiglu_mlp": kernels.fuse_swiglu_mlps(model),
        "onednn_linear": kernels.fast_linears(model) if kernels.onednn_ready() else 0,
    }
