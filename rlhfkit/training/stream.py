"""A deterministic stream of example indices whose position is one integer (for exact resume).

Epoch ``e`` visits the examples in the order ``randperm(n)`` seeded with ``seed + e``; batches are
taken from the concatenation of the epochs. The order does not depend on the batch size, so
"8 rows x 1 step" and "1 row x 8 accumulated" see the same rows.
"""

from __future__ import annotations

import torch


class IndexStream:
    def __init__(self, n: int, seed: int, shuffle: bool = True, consumed: int = 0):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.consumed = consumed
        self._epoch, self._order = -1, None

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed + epoch)
                self._order = torch.randperm(self.n, generator=gen).tolist()
            else:
                self._order = list(range(self.n))
            self._epoch = epoch
        return self._order

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, offset = divmod(self.consumed, self.n)
            out.append(self._order_of(epoch)[offset])
            self.consumed += 1
        return out

    @property
    def epoch(self) -> float:
        return self.consumed / self.n

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])
