"""Log-probs and entropy over a large vocabulary, a block of positions at a time.

At a real vocabulary (V = 32k-150k) the logits ``[B, T, V]`` are the largest tensors of a step, and the plain
formulas (``logprobs_from_logits``, ``entropy_from_logits``) allocate several more of that size: ``logsumexp``'s
exponentials, ``log_softmax``, the probabilities, their product, and autograd keeps some of them for the
backward pass. These functions compute the same values and the same gradients (each entry's formula is
unchanged) with at most one ``[rows, V]`` block of ``block_elements`` entries alive besides the logits and their
gradient: the forward keeps only one number per position (its logsumexp, and for the entropy the entropy
itself), and the backward recomputes the probabilities block by block, writing each block of the gradient in
place. ``rlhfkit.accel.vocab`` decides when a model's passes take them.
"""

from __future__ import annotations

import torch

BLOCK_ELEMENTS = 1 << 24  # logits entries per block unless the caller gives another size


def rows_per_block(vocab: int, block_elements: int = BLOCK_ELEMENTS) -> int:
    """Rows of a ``[rows, vocab]`` block of at most ``block_elements`` entries (at least one row)."""
    return max(1, block_elements // max(vocab, 1))


class _LabelLogprobs(torch.autograd.Function):
    """``log softmax(z)[y]`` per row of ``z [N, V]``: ``z_y − logsumexp(z)``; d/dz = onehot(y) − softmax(z)."""

    @staticmethod
    def forward(ctx, logits, labels, rows: int):
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for s in range(0, logits.shape[0], rows):
            lse[s : s + rows] = torch.logsumexp(logits[s : s + rows].float(), dim=-1)
        out = logits.gather(-1, labels[:, None]).squeeze(-1).float() - lse
        ctx.save_for_backward(logits, labels, lse)
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        rows = ctx.rows
        for s in range(0, logits.shape[0], rows):
            g = grad_out[s : s + rows, None]  # [n, 1]
            block = torch.exp(logits[s : s + rows].float() - lse[s : s + rows, None]).mul_(-g)  # −p·g
            block.scatter_add_(-1, labels[s : s + rows, None], g)
            grad[s : s + rows] = block
        return grad, None, None


class _Entropy(torch.autograd.Function):
    """``H = −Σ_v p_v log p_v`` per row, ``p = softmax(z)``; dH/dz_j = −p_j (log p_j + H). Entries with
    p = 0 (logit −inf) add nothing to either."""

    @staticmethod
    def _block(z, lse):
        logp = z - lse[:, None]
        p = logp.exp()
        return p, logp.masked_fill(p == 0, 0.0)

    @staticmethod
    def forward(ctx, logits, rows: int):
        n = logits.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n, dtype=torch.float32, device=logits.device)
        for s in range(0, n, rows):
            z = logits[s : s + rows].float()
            lse[s : s + rows] = torch.logsumexp(z, dim=-1)
            p, logp = _Entropy._block(z, lse[s : s + rows])
            entropy[s : s + rows] = -(p * logp).sum(-1)
        ctx.save_for_backward(logits, lse, entropy)
        ctx.rows = rows
        return entropy

    @staticmethod
    def backward(ctx, grad_out):
        logits, lse, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)
        rows = ctx.rows
        for s in range(0, logits.shape[0], rows):
            p, logp = _Entropy._block(logits[s : s + rows].float(), lse[s : s + rows])
            grad[s : s + rows] = -(p * (logp + entropy[s : s + rows, None])) * grad_out[s : s + rows, None]
        return grad, None


def chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor, block_elements: int = BLOCK_ELEMENTS) -> torch.Tensor:
    """``logprobs_from_logits`` block by block: ``[..., V]``, ``[...]`` -> float32 ``[...]``.

    log p(y_t) = z_t[y_t] − logsumexp_v z_t[v],  d/dz_t = onehot(y_t) − softmax(z_t)"""
    vocab = logits.shape[-1]
    rows = rows_per_block(vocab, block_elements)
    out = _LabelLogprobs.apply(logits.reshape(-1, vocab), labels.reshape(-1), rows)
    return out.view(labels.shape)


def chunked_entropy(logits: torch.Tensor, block_elements: int = BLOCK_ELEMENTS) -> torch.Tensor:
    """``entropy_from_logits`` block by block: ``[..., V]`` -> float32 ``[...]``.

    H_t = −Σ_v p_v log p_v,  dH_t/dz_j = −p_j (log p_j + H_t)"""
    vocab = logits.shape[-1]
    rows = rows_per_block(vocab, block_elements)
    return _Entropy.apply(logits.reshape(-1, vocab), rows).view(logits.shape[:-1])
