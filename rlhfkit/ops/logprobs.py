"""Log-probabilities of given tokens from a model's logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] for every position: ``[B, T, V]``, ``[B, T]`` -> ``[B, T]``.

        log p(y_t) = z_t[y_t] − logsumexp_v z_t[v]
    In float32/64 this never materialises the full ``[B, T, V]`` log-softmax. Half-precision logits
    (bf16/fp16) are upcast one row at a time, since logsumexp in bf16 loses too much precision. At a real
    vocabulary ``chunked_logprobs`` gives the same values and gradients without a second ``[B, T, V]`` tensor.
    """
    if logits.dtype in (torch.float32, torch.float64):
        label_logits = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return label_logits - torch.logsumexp(logits, dim=-1)
    rows = [
        F.log_softmax(row.float(), dim=-1).gather(-1, row_labels.unsqueeze(-1)).squeeze(-1)
        for row, row_labels in zip(logits, labels)
    ]
    return torch.stack(rows)
