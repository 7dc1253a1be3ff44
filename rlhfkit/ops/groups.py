"""Rows grouped by prompt, for the estimators that compare the completions of a prompt (GRPO, RLOO,
REINFORCE++-baseline).

Each row names its group in ``group_ids``, a LongTensor ``[B]`` (as verl's group estimators take an ``index``):
a group's rows need not be contiguous, and groups need not be of one size (a row left out, rows gathered from
several processes). :class:`Groups` lays a per-row tensor ``[B]`` out as a matrix ``[K, G]``, one row per group
(K groups in increasing id, G the largest group's size, a shorter group padded), and puts a ``[K, G]`` result back
in the batch's row order.
"""

from __future__ import annotations

import torch
from torch import Tensor


class Groups:
    """The prompt groups of a batch, from ``group_ids`` ``[B]`` (any integers; equal ids share a prompt).

    ``order`` ``[B]``: the rows group by group (stable, so a group's rows keep their order); ``sizes`` ``[K]``: the
    groups' sizes; ``mask`` ``[K, G]``: True on a group's real entries of :meth:`matrix`."""

    def __init__(self, group_ids: Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
        if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
            raise ValueError(f"group_ids must be integers, got {group_ids.dtype}")
        self.order = torch.argsort(group_ids, stable=True)  # [B]
        _, self.sizes = torch.unique_consecutive(group_ids[self.order], return_counts=True)  # [K]
        self.width = int(self.sizes.max()) if len(self.sizes) else 0  # G
        positions = torch.arange(self.width, device=group_ids.device)
        self.mask = positions.unsqueeze(0) < self.sizes.unsqueeze(1)  # [K, G]
        self.ragged = bool((self.sizes != self.width).any())  # some group is shorter than the largest

    @classmethod
    def contiguous(cls, batch: int, group_size: int, device=None) -> Groups:
        """Rows ``[k·G, (k+1)·G)`` form group k (G = ``group_size``, ``batch`` a multiple of it)."""
        return cls(torch.arange(batch, device=device) // group_size)

    def __len__(self) -> int:
        return len(self.sizes)

    def matrix(self, x: Tensor) -> Tensor:
        """``[B]`` -> ``[K, G]``, one row per group; a shorter group's missing entries are 0 (see ``mask``)."""
        rows = x[self.order]
        if not self.ragged:
            return rows.view(len(self), self.width)
        out = x.new_zeros(len(self), self.width)
        out[self.mask] = rows
        return out

    def rows(self, m: Tensor) -> Tensor:
        """``[K, G]`` -> ``[B]``: each row's entry, in the batch's row order (the inverse of :meth:`matrix`)."""
        entries = m.reshape(-1) if not self.ragged else m[self.mask]
        out = torch.empty_like(entries)
        out[self.order] = entries
        return out

    def count(self, m: Tensor) -> Tensor:
        """``[K, 1]`` each group's size n_g, in ``m``'s dtype."""
        return self.sizes.to(m.dtype).unsqueeze(1)

    def sum(self, m: Tensor) -> Tensor:
        """``[K, 1]`` Σ of each group's entries of ``m`` ``[K, G]``."""
        return m.sum(dim=-1, keepdim=True) if not self.ragged else (m * self.mask).sum(dim=-1, keepdim=True)

    def mean(self, m: Tensor) -> Tensor:
        """``[K, 1]`` each group's mean of ``m`` ``[K, G]``."""
        return m.mean(dim=-1, keepdim=True) if not self.ragged else self.sum(m) / self.count(m)

    def std(self, m: Tensor) -> Tensor:
        """``[K, 1]`` each group's unbiased std of ``m`` ``[K, G]`` (Bessel's correction); 0 for a group of one,
        whose centred entry is 0 anyway."""
        if not self.ragged:
            return m.std(dim=-1, keepdim=True) if self.width > 1 else torch.zeros_like(m[:, :1])
        n = self.count(m)
        squares = ((m - self.mean(m)) * self.mask) ** 2
        var = squares.sum(dim=-1, keepdim=True) / (n - 1).clamp(min=1)
        return torch.where(n > 1, var.sqrt(), 0.0)
