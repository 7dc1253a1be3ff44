"""Device, precision, seeding and multi-process set-up through ``accelerate``."""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

from rlhfkit.errors import UserError, option
from rlhfkit.training import engines


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """torch's CPU threads set to ``n`` (``--threads``; 0 leaves them as they are) while a command runs, and put
    back after. The inter-op pool can be sized only before its first use, so it is set when that is still
    possible and left as it is otherwise."""
    if not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # the pool already started: its size is fixed for the process
        torch.set_num_interop_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def make_accelerator(run):
    """An ``Accelerator`` for ``run`` (a RunArgs). 'auto' precision is bf16 on a GPU that has it.

    Gradient accumulation is done by the trainers' step loop (see ``optim.accumulate``), not by
    accelerate, because its per-micro-batch loss division is only right for equal token counts.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    check_processes_per_gpu(run.cpu)
    precision = run.mixed_precision
    if precision == "auto":
        precision = "bf16" if (torch.cuda.is_available() and torch.cuda.is_bf16_supported() and not run.cpu) else "no"
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=run.dist_timeout))
    accelerator = Accelerator(mixed_precision=precision, cpu=_cpu(run.cpu), log_with=None, kwargs_handlers=[timeout])
    engines.use_fsdp_on_cpu(accelerator)
    return accelerator


def check_processes_per_gpu(cpu: bool) -> None:
    """Several GPU processes on one machine each need a GPU of their own (NCCL refuses two ranks on one GPU, with
    an error that does not say so); stop at once, naming the fix, when the launcher started more than there are."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if cpu or local <= 1 or not torch.cuda.is_available():
        return
    gpus = torch.cuda.device_count()
    if local > gpus:
        raise UserError(
            f"{local} processes on this machine but {gpus} GPU{'s' if gpus != 1 else ''}: each process needs its own "
            f"GPU; start at most {gpus} per machine (torchrun --nproc-per-node {gpus}), or pass "
            f"{option('cpu', True)} to run the processes on the CPU"
        )


def _cpu(requested: bool) -> bool:
    """CPU-only: asked for, or several processes on a machine without a GPU (accelerate then sets up gloo
    only when told the run is on CPU)."""
    several = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    return requested or (several and not torch.cuda.is_available())


def process_state(cpu: bool, dist_timeout: int):
    """The process group of a command that runs without an ``Accelerator`` (generate, score, eval): set up
    from the launcher's environment when there are several processes; ``.device``, ``.process_index``,
    ``.num_processes`` as accelerate's ``PartialState``."""
    from accelerate import PartialState

    check_processes_per_gpu(cpu)
    return PartialState(cpu=_cpu(cpu), timeout=datetime.timedelta(seconds=dist_timeout))


def pick_device(cpu: bool = False) -> torch.device:
    """The device of a command that runs without an ``Accelerator`` (generate, score, eval): the GPU when
    there is one and ``--cpu`` is not given."""
    return torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


_DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "dropout", "dropout_p")


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability to 0: RL and preference losses compare log-probs across passes.

    Covers ``nn.Dropout`` modules and the float rates that attention layers pass to a functional
    dropout in training mode (e.g. Llama's ``attention_dropout``), so train and eval mode agree.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in _DROPOUT_ATTRS:
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


@functools.cache
def _glibc():
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None (macOS, musl, Windows)."""
    import ctypes
    import ctypes.util

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
    sampling, the teacher-forced passes' activations before the update), and the next phase's tensors then
    come on top of those pages in the process's resident size. Trimming between phases costs milliseconds, and
    the next phase's first touch of each page it gets back (see ``keep_freed_memory``)."""
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
    operating system; returns whether it did (glibc, no malloc settings in the environment, ``RLHFKIT_ACCEL``
    not off). Process-wide, for the rest of the process.

    A page the operating system hands (back) to the process costs a page fault and a zero-fill at its first
    touch (a 4 KB page at a time; a ``[49152, 576]`` gradient is 27,648 of them). By default glibc returns the
    freed top of the heap once it exceeds twice the (moving) mmap threshold, maps tensors above that threshold
    fresh each time, and ``malloc_trim`` returns every free page: a full PPO step on a 135M model took ~950k
    such faults, and avoiding them took the step from ~8.2 to ~6.9 s on a 2-core VM (~1.4 us a fault).
    With every tensor taken from the heap (no mappings of their own) and the heap's freed memory kept, each
    phase reuses the pages the previous one freed. The resident size then stays near its peak between phases;
    the peak itself is what the phases need at once, plus what fragmentation leaves unusable (measured within
    +-100 MB of a 6.5 GB PPO step's)."""
    from rlhfkit.accel import enabled

    libc = _glibc()
    if libc is None or not enabled() or _user_malloc_settings():
        return False
    return all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD),
            (_M_TOP_PAD, HEAP_TOP_PAD),
            (_M_MMAP_MAX, 0),  # no tensor gets a mapping of its own (unless the heap cannot grow)
        )
    )
