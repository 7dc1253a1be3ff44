"""Split one optimizer step's rows into this process's micro-batches."""

from __future__ import annotations

from rlhfkit.data.collate import chunks
from rlhfkit.training.distributed import Ranks
from rlhfkit.training.stream import IndexStream


def step_indices(stream: IndexStream, optim, ranks: Ranks) -> list[list[int]]:
    """Take one step's ``--batch-size`` rows (the same rows on every process) and return this process's
    block, split into ``--gradient-accumulation-steps`` micro-batches."""
    mine = ranks.block(stream.take(optim.batch_size))
    micro = len(mine) // optim.gradient_accumulation_steps
    return chunks(mine, micro)
