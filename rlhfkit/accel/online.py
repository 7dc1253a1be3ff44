"""The online trainers' memory and performance choreography, behind one object with a few hooks.

``OnlineAccel`` is made once by ``rlhfkit.trainers.online.trainer.OnlineTrainer``, which calls it at fixed points
of its step (``after_sampling``, ``after_rollout``) and asks it how the value model's passes run
(``value_apart``, ``value_rows``). It applies what ``rlhfkit.accel.choices(device)`` lists for the run's device
(``kept_heap``, ``value_pass_apart``: the CPU's, under ``--accel auto``); under ``--accel off``, or where they do
not apply, it does nothing special: the heap is left to the allocator and the value model runs in one pass with
the policy.

What it does where they apply:
- On the CPU, glibc's malloc keeps the memory freed tensors leave for the next tensors
  (``keep_freed_memory``); where the heap cannot be kept, its free pages are handed back between the step's
  phases (``release_freed_memory``).
- A separate value model runs its forward and backward apart from the policy's, in smaller micro-batches, so
  the two networks' activations are never held at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import torch
from torch import nn

from rlhfkit.accel.base import choices, on

VALUE_PASS_SPLIT = 4  # the value model's pass apart runs in micro-batches this many times smaller


class OnlineAccel:
    """The performance choices of one online-RL run and the hooks that apply them.

    ``device``: the run's device. ``value_model``: a separate value model (None for a value head or no critic).
    ``value_pass_apart``: the option asking for the value model's pass apart. ``single_process``: one process
    without a sharding engine (several processes' gradient sync expects one backward per micro-batch)."""

    def __init__(
        self,
        device: torch.device,
        *,
        value_model: nn.Module | None,
        value_pass_apart: bool,
        single_process: bool,
    ):
        chosen = choices(device)
        self.keeps_heap = chosen.kept_heap and keep_freed_memory()
        self.trims_heap = chosen.kept_heap and not self.keeps_heap
        self.value_apart = bool(
            chosen.value_pass_apart and value_pass_apart and value_model is not None and single_process
        )
        """Whether the value model's forward and backward run apart from the policy's (else one joint pass, and a
        separate no-grad pass for the rollout's values)."""

    def value_rows(self, rows: int) -> int:
        """Rows of each of the value model's micro-batches when its pass runs apart on ``rows`` rows."""
        return max(1, -(-rows // VALUE_PASS_SPLIT))

    def after_sampling(self) -> None:
        """After step 1: the sampler's key / value buffers are freed."""
        if self.trims_heap:
            release_freed_memory()

    def after_rollout(self) -> None:
        """After steps 2-6: the teacher-forced passes' activations are freed (all but a reused first pass's)."""
        if self.trims_heap:
            release_freed_memory()


# ---- the heap ------------------------------------------------------------------------------------------------
@functools.cache
def _glibc():
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None (macOS, musl, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the operating system (glibc's ``malloc_trim``; elsewhere nothing).

    Tensors larger than glibc's mmap threshold are first given their own mappings, but once one is freed the
    threshold rises to its size, so later tensors of that size come from the heap, and the heap keeps what they
    free. An online step frees whole phases' worth of them (the decode step's key / value buffers after
    sampling, the teacher-forced passes' activations before the update), and the next phase's tensors would
    otherwise come on top of those pages in the process's resident size."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# glibc's mallopt parameters (malloc.h) and the values keep_freed_memory sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
HEAP_TOP_PAD = 64 << 20  # the heap grows by at least this much at a time
HEAP_TRIM_THRESHOLD = (1 << 31) - 1  # the top of the heap is not handed back while the process runs


def _user_malloc_settings() -> bool:
    """Whether the environment already tunes glibc's malloc (or swaps the allocator): those are left alone."""
    env = os.environ
    return (
        "glibc.malloc." in env.get("GLIBC_TUNABLES", "")
        or any(k.startswith("MALLOC_") and k.endswith("_") for k in env)
        or any(name in env.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc"))
    )


def keep_freed_memory() -> bool:
    """Have glibc keep the memory freed tensors leave for the next tensors, instead of returning it to the
    operating system; returns whether it did (glibc, no malloc settings in the environment, the performance code
    on). Process-wide, for the rest of the process.

    A page the operating system hands (back) to the process costs a page fault and a zero-fill at its first
    touch, a page at a time. By default glibc returns the freed top of the heap once it exceeds twice the
    (moving) mmap threshold, maps tensors above that threshold fresh each time, and ``malloc_trim`` returns every
    free page, so each phase of an online step faults in the pages the previous one gave back. With every tensor
    taken from the heap (no mappings of their own) and the heap's freed memory kept, each phase reuses the pages
    the previous one freed. The resident size then stays near its peak between phases; the peak itself is what
    the phases need at once, plus what fragmentation leaves unusable."""
    libc = _glibc()
    if libc is None or not on("kept_heap") or _user_malloc_settings():
        return False
    return all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD),
            (_M_TOP_PAD, HEAP_TOP_PAD),
            (_M_MMAP_MAX, 0),  # no tensor gets a mapping of its own (unless the heap cannot grow)
        )
    )
