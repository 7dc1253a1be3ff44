"""Padding and batching shared by every trainer (one copy, so left/right padding cannot drift apart).

Sequences are right-padded: real tokens first, then padding. A ``response_mask`` marks the response
tokens of prompt + response rows; reward models read the score at the last real token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhfkit.data.encode import Encoded


def chunks(items: list, size: int) -> list[list]:
    """``items`` in consecutive lists of ``size`` (the last one shorter)."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def pad(seqs: list[list[int]], value: int, side: str = "right") -> torch.Tensor:
    """``[B, L]`` long tensor of the sequences padded with ``value`` to the longest."""
    width = max(len(s) for s in seqs)
    rows = [(s + [value] * (width - len(s))) if side == "right" else ([value] * (width - len(s)) + s) for s in seqs]
    return torch.tensor(rows, dtype=torch.long)


def pad_with_mask(
    seqs: list[list[int]], pad_id: int, side: str = "right", device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, L], mask [B, L])``: the sequences padded with ``pad_id`` on ``side``, mask 1 on real tokens.

    Prompts for generation are padded on the left (every row's last prompt token in the last column);
    responses on the right."""
    ids = pad(seqs, pad_id, side)
    mask = pad([[1] * len(s) for s in seqs], 0, side)
    return ids.to(device), mask.to(device)


@dataclass
class SequenceBatch:
    """Right-padded prompt + response rows.

    input_ids:      [B, L]
    attention_mask: [B, L]  1 on real tokens
    response_mask:  [B, L]  1 on response tokens (aligned with input_ids, not shifted)
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor

    def to(self, device) -> SequenceBatch:
        return SequenceBatch(self.input_ids.to(device), self.attention_mask.to(device), self.response_mask.to(device))

    def last_token_index(self) -> torch.Tensor:
        """``[B]`` position of each row's last real token."""
        return self.attention_mask.sum(dim=1) - 1


def collate_pairs(items: list[Encoded], pad_id: int) -> SequenceBatch:
    ids = [e.prompt_ids + e.response_ids for e in items]
    resp = [[0] * len(e.prompt_ids) + [1] * len(e.response_ids) for e in items]
    input_ids, attention_mask = pad_with_mask(ids, pad_id)
    return SequenceBatch(input_ids, attention_mask, pad(resp, 0))


def collate_preferences(pairs: list[tuple[Encoded, Encoded]], pad_id: int) -> SequenceBatch:
    """Chosen rows then rejected rows in one ``[2B, L]`` batch, so both go through one forward pass."""
    return collate_pairs([c for c, _ in pairs] + [r for _, r in pairs], pad_id)


def collate_sft(
    items: list[tuple[list[int], list[int]]], pad_id: int, ignore_index: int = -100
) -> dict[str, torch.Tensor]:
    input_ids, attention_mask = pad_with_mask([i for i, _ in items], pad_id)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": pad([lab for _, lab in items], ignore_index),
    }
