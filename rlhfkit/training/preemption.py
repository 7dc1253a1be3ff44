"""Stopping cleanly when the cluster asks: SIGTERM or SIGINT finishes the current step, writes a checkpoint,
and exits non-zero with the command that resumes.

SLURM and Kubernetes send SIGTERM some seconds before they kill a job (a Ctrl-C is SIGINT). The handler only
records the signal; the training loop asks ``stop_requested`` at the end of every step, where every process
agrees (one small all-reduce), so all ranks save the same step and stop together. A second signal while the
step finishes is not caught: it stops the process at once.
"""

from __future__ import annotations

import signal
import threading

from rlhfkit.training.distributed import any_rank

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """Records SIGTERM/SIGINT while installed (``with StopSignal() as stop: ...``)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        for sig, handler in self._previous.items():  # a second signal is not caught again
            signal.signal(sig, handler)

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def requested(self, accelerator) -> bool:
        """Whether any process received a signal (the same answer on every process)."""
        return any_rank(accelerator, self.signum is not None)

    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "a signal on another process"
