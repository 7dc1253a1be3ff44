"""More than one process: how a global batch is split over ranks, and how ranks exchange rows and numbers.

Every command runs unchanged under ``torchrun``/``accelerate launch``. The rules, the same for all of them:

* ``--batch-size`` is the global number of rows per optimizer step. Every rank draws the same global batch
  from the same seeded stream and keeps its own contiguous block (rank r: rows ``[r*b, (r+1)*b)`` with
  ``b = batch_size / world``), so the data order does not depend on the number of processes.
* Each rank has its own sampling randomness (seed + rank), so ranks generate different completions.
* What must be global (whitening, group and batch statistics, the KL controller, metrics) is computed
  from rows gathered from every rank, in rank order: the same numbers one process would compute on the
  whole batch.
* Files (metrics, samples, checkpoints' shared parts, the final model) are written by rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlhfkit.errors import UserError


@dataclass(frozen=True)
class Ranks:
    """This process's place: ``rank`` in ``[0, world)``."""

    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def block(self, items: list) -> list:
        """This rank's contiguous share of ``items`` (whose length the world size divides)."""
        size = len(items) // self.world
        return items[self.rank * size : (self.rank + 1) * size]

    def span(self, n: int) -> list:
        """This rank's share of ``n`` items when the world size need not divide ``n``: contiguous blocks,
        the first ``n % world`` ranks one item longer (concatenated in rank order they are ``range(n)``)."""
        size, extra = divmod(n, self.world)
        start = self.rank * size + min(self.rank, extra)
        return list(range(start, start + size + (self.rank < extra)))


def ranks_of(accelerator=None) -> Ranks:
    """The ranks of ``accelerator``, or of the initialised process group, or a single process."""
    if accelerator is not None:
        return Ranks(accelerator.process_index, accelerator.num_processes)
    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    return Ranks()


def per_rank(total: int, world: int, *, what: str, unit: int = 1, unit_what: str = "") -> int:
    """``total / world`` rows per rank, checking that it divides into whole ``unit``s (e.g. micro-batches,
    or groups of completions). Raises a UserError naming the numbers otherwise."""
    if total % (world * unit):
        parts = f"the number of processes ({world})"
        if unit > 1:
            parts += f" x {unit_what} ({unit})"
        raise UserError(f"{what} {total} must be divisible by {parts}")
    return total // world


def gather_rows(accelerator, x: torch.Tensor | None, pad_value=0, pad_first: bool = False) -> torch.Tensor | None:
    """``[b, ...]`` on each rank -> ``[world * b, ...]`` on every rank, rank 0's rows first. Dimension 1 is
    padded to the longest rank's (at the front with ``pad_first``, for left-padded prompts)."""
    if x is None or accelerator.num_processes == 1:
        return x
    if x.dim() > 1:
        x = accelerator.pad_across_processes(x, dim=1, pad_index=pad_value, pad_first=pad_first)
    return accelerator.gather(x.contiguous())


def gather_objects(items: list) -> list:
    """Lists of picklable items from every rank, concatenated in rank order (the input when alone)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(items)
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, list(items))
    return [item for part in parts for item in part]


def reduce_mean(accelerator, values: dict[str, float]) -> dict[str, float]:
    """The mean over ranks of each value (every rank must pass the same keys in the same order)."""
    if accelerator.num_processes == 1 or not values:
        return values
    keys = list(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    return {k: float(v) for k, v in zip(keys, accelerator.reduce(tensor, "mean"))}


def reduce_sum(accelerator, value: float) -> float:
    if accelerator.num_processes == 1:
        return float(value)
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=accelerator.device)
    return float(accelerator.reduce(tensor, "sum")[0])


def any_rank(accelerator, flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one."""
    if accelerator.num_processes == 1:
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(tensor, "sum")[0] > 0)
