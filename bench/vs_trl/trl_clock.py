"""The step clock both TRL runners (trl_runner.py, trl_grpo_runner.py) time their trainer with: a
``TrainerCallback`` that reads the wall clock at the start of training and at the end of every optimizer step,
so TRL's code runs unchanged."""

from __future__ import annotations

import time

from transformers import TrainerCallback


class StepClock(TrainerCallback):
    """Wall-clock time at the start of training and at the end of every optimizer step."""

    def __init__(self):
        self.train_begin = None
        self.step_ends: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.train_begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())
