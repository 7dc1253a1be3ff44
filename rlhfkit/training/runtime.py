"""Device, precision, seeding and multi-process set-up through ``accelerate``."""

from __future__ import annotations

import contextlib
import datetime
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

from rlhfkit.errors import UserError, option
from rlhfkit.training import engines, trackers


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
    """An ``Accelerator`` for ``run`` (a RunArgs) with its --report-to trackers (not started yet: see
    ``trackers.start``). 'auto' precision is bf16 on a GPU that has it.

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
    log_with = trackers.build(trackers.tracker_names(run.report_to), run)
    accelerator = Accelerator(
        mixed_precision=precision, cpu=_cpu(run.cpu), log_with=log_with or None, kwargs_handlers=[timeout]
    )
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
