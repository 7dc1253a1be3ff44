"""Split one optimizer step's rows into this process's micro-batches."""

from __future__ import annotations

from rlhfkit.training.stream import IndexStream


def step_indices(stream: IndexStream, optim, accelerator) -> list[list[int]]:
    """Take one step's rows (batch_size x accumulation x processes) and return this process's micro-batches."""
    per_process = optim.batch_size * optim.gradient_accumulation_steps
    rows = stream.take(per_process * accelerator.num_processes)
    mine = rows[accelerator.process_index * per_process : (accelerator.process_index + 1) * per_process]
    return [mine[i : i + optim.batch_size] for i in range(0, per_process, optim.batch_size)]


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]
