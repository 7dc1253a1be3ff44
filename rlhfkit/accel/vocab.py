"""Block-wise vocabulary log-probs: the LM head and the log-probs (and entropy) a block of positions at a time.

At a real vocabulary (V = 32k-150k) the logits ``[B, T, V]`` are the largest tensors of a step, and the plain
formulas allocate several more of that size. ``logprobs`` and ``entropy`` take logits of more than
``CHUNK_ELEMENTS`` entries through ``rlhfkit.ops.vocab_chunks`` (the same values and gradients with one
``[rows, V]`` block alive at a time); ``head_logprobs`` goes further and never builds the logits: each block's
``h W^T`` is made, used and dropped, in the forward and again in the backward. On the CPU in fp32 its blocks are
kept between calls (``_kept``) and its products may run through oneDNN (``HeadProduct``).

``RLHFKIT_VOCAB_CHUNK=N`` sets the block size in logits entries (0: the plain formulas); under ``--accel off``
the plain formulas run whatever it says.
"""

from __future__ import annotations

import os
import threading

import torch
from torch import nn

from rlhfkit.accel import onednn
from rlhfkit.accel.base import choices
from rlhfkit.accel.onednn import fp32_cpu, pad_rows
from rlhfkit.ops import entropy_from_logits, logprobs_from_logits
from rlhfkit.ops.vocab_chunks import chunked_entropy, chunked_logprobs

CHUNK_ELEMENTS = int(os.environ.get("RLHFKIT_VOCAB_CHUNK", 1 << 24)) or (1 << 62)  # logits entries per block


def rows_per_chunk(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


def blocks_apply(logits_entries: int, device: torch.device) -> bool:
    """Whether logits of this many entries on ``device`` go block by block: the switch on and more than one block."""
    return logits_entries > CHUNK_ELEMENTS and choices(device).vocab_blocks


def logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``rlhfkit.ops.logprobs_from_logits``, block by block where ``blocks_apply``: ``[..., V]``, ``[...]`` ->
    ``[...]``."""
    if logits.dtype != torch.float64 and blocks_apply(logits.numel(), logits.device):
        return chunked_logprobs(logits, labels, CHUNK_ELEMENTS)
    return logprobs_from_logits(logits, labels)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """``rlhfkit.ops.entropy_from_logits``, block by block where ``blocks_apply``: ``[..., V]`` -> ``[...]``."""
    if logits.dtype != torch.float64 and blocks_apply(logits.numel(), logits.device):
        return chunked_entropy(logits, CHUNK_ELEMENTS)
    return entropy_from_logits(logits)


class Product:
    """How the LM head's block products ``a @ b`` run on the CPU in fp32: ``mm`` into a block kept between calls
    (``_kept``). A kernel with a per-shape cost (oneDNN's: ``HeadProduct``) overrides both
    methods: ``mm`` returns a new tensor, and ``rows(m)`` is the row count it wants a block of ``m`` rows padded to
    (zero rows: their outputs are dropped, their gradients are zero)."""

    def mm(self, a: torch.Tensor, b: torch.Tensor, slot: int) -> torch.Tensor:
        return torch.mm(a, b, out=_kept(slot, a.shape[0], b.shape[1])) if slot >= 0 else torch.mm(a, b)

    def rows(self, m: int) -> int:
        return m


PLAIN = Product()


class _HeadLogprobs(torch.autograd.Function):
    """The LM head and the log-probs (and entropy) together, a block of positions at a time: ``z = h W^T / τ``
    per block, never the whole ``[N, V]``. The backward recomputes each block's ``z`` and probabilities, and
    adds its part of ``dL/dh = g W / τ`` and ``dL/dW = g^T h / τ`` (``g = dL/dz``, as in ``rlhfkit.ops.vocab_chunks``).
    Unlike logits given from outside (top-k filtering writes −inf), a product of finite states and weights is
    finite, so no entry needs masking.

    Each block's arithmetic runs in place on the block's logits and one block of probabilities: at a real
    vocabulary a ``[rows, V]`` block is large enough that the allocator maps it afresh (and the kernel zero-fills
    it) each time one is allocated, so every temporary of that size costs a pass over new memory. On the CPU in fp32
    the products run through ``product`` (``Product``), the positions padded with zero rows to the block sizes it
    wants."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, inv_temperature: float, with_entropy: bool, product: Product):
        n = hidden.shape[0]
        if not fp32_cpu(hidden, weight):
            product = PLAIN
        rows = product.rows(rows_per_chunk(weight.shape[0]))
        total = n - n % rows + (product.rows(n % rows) if n % rows else 0)
        hidden, labels = pad_rows(hidden, total), pad_rows(labels, total)
        lse = torch.empty(total, dtype=torch.float32, device=hidden.device)
        logprobs = torch.empty(total, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros(total if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in range(0, total, rows):
            z = _logits(hidden[s : s + rows], weight, inv_temperature, product)
            top = z.amax(dim=-1, keepdim=True)
            label_logit = z.gather(-1, labels[s : s + rows, None]).squeeze(-1)
            z.sub_(top)  # z - max: exp cannot overflow
            e = _exp(z, rows) if with_entropy else z.exp_()  # the entropy needs z - max as well
            sums = e.sum(-1)
            lse[s : s + rows] = top.squeeze(-1) + sums.log()
            logprobs[s : s + rows] = label_logit - lse[s : s + rows]
            if with_entropy:  # H = lse - Σ p z = log Σe - Σ e (z - max) / Σe (z is finite: e = 0 adds 0)
                z.mul_(e)
                entropy[s : s + rows] = sums.log() - z.sum(-1) / sums
        ctx.save_for_backward(hidden, weight, labels, lse, entropy)
        ctx.inv_temperature, ctx.with_entropy, ctx.product, ctx.rows, ctx.n = (
            inv_temperature,
            with_entropy,
            product,
            rows,
            n,
        )
        return logprobs[:n], entropy[:n]

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        total, rows, product = hidden.shape[0], ctx.rows, ctx.product
        grad_logprobs = pad_rows(grad_logprobs, total)  # the padding rows' outputs were dropped: no gradient
        grad_entropy = None if grad_entropy is None else pad_rows(grad_entropy, total)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = None
        for s in range(0, total, rows):
            h = hidden[s : s + rows]
            logp = _logits(h, weight, ctx.inv_temperature, product).sub_(lse[s : s + rows, None])
            g = _exp(logp, rows)  # p, then d loss / dz in place
            g_lp = grad_logprobs[s : s + rows, None]
            if ctx.with_entropy and grad_entropy is not None:  # dH/dz = -p (log p + H); log p is finite here
                logp.add_(entropy[s : s + rows, None]).mul_(g)
                logp.mul_(grad_entropy[s : s + rows, None])
                g.mul_(-g_lp).scatter_add_(-1, labels[s : s + rows, None], g_lp).sub_(logp)
            else:
                g.mul_(-g_lp).scatter_add_(-1, labels[s : s + rows, None], g_lp)  # d logprob / dz
            if ctx.inv_temperature != 1.0:
                g.mul_(ctx.inv_temperature)  # through z = raw / τ
            g = g.to(hidden.dtype)
            if need_hidden:  # (a product other than PLAIN only runs in fp32: see forward)
                grad_hidden[s : s + rows] = product.mm(g, weight, -1)
            if need_weight:  # the first block's product is the sum so far; no zero-filled [V, H] first
                if grad_weight is None:
                    grad_weight = (g.T @ h).float()
                elif g.dtype == torch.float32 and h.dtype == torch.float32:
                    grad_weight.addmm_(g.T, h)  # no [V, H] temporary per block
                else:
                    grad_weight += (g.T @ h).float()
        grad_hidden = None if grad_hidden is None else grad_hidden[: ctx.n]
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, inv_temperature: float, product: Product) -> torch.Tensor:
    """A block's ``hidden @ weight^T / τ`` as a float32 tensor the in-place steps may write: on the CPU in fp32
    through ``product`` (by default into a block kept between calls, ``_kept``), else a new tensor."""
    if fp32_cpu(hidden, weight):
        z = product.mm(hidden, weight.T, 0)
    else:
        z = hidden @ weight.T  # in the autocast dtype where autocast is on
        z = z.float() if z.dtype != torch.float32 else z
    return z.mul_(inv_temperature) if inv_temperature != 1.0 else z


def _exp(z: torch.Tensor, block_rows: int) -> torch.Tensor:
    """``exp(z)`` of a float32 block, on the CPU into the second kept block."""
    if z.device.type == "cpu":
        return torch.exp(z, out=_kept(1, *z.shape, block_rows))
    return z.exp()


_KEPT = threading.local()  # each thread its own blocks, freed with the thread


def _kept(slot: int, rows: int, vocab: int, block_rows: int | None = None) -> torch.Tensor:
    """The first ``rows`` rows of the ``slot``-th ``[block_rows, vocab]`` float32 block kept on the CPU (by default
    ``rows_per_chunk(vocab)`` rows). A fresh block of this size is a new mapping of the process's memory,
    zero-filled page by page on its first touch; the passes of a training step take several, so two are kept and
    written over instead (until ``release_blocks``)."""
    blocks = _KEPT.__dict__.setdefault("blocks", {})
    shape = (max(block_rows or 0, rows_per_chunk(vocab)), vocab)
    if slot not in blocks or blocks[slot].shape != shape:  # one block per slot: the last head's size
        blocks[slot] = torch.empty(shape, dtype=torch.float32)
    return blocks[slot][:rows]


def release_blocks() -> None:
    """Free this thread's kept blocks (a training run calls it when it ends)."""
    _KEPT.__dict__.pop("blocks", None)


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    product: Product = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``labels`` (and the entropy) under ``softmax(hidden @ weight^T / temperature)`` without building
    the logits: ``hidden [..., H]``, ``weight [V, H]`` (a bias-free LM head), ``labels [...]`` -> float32 ``[...]``
    each (entropy None unless asked). Values and gradients are those of ``logprobs_from_logits`` and
    ``entropy_from_logits`` on the logits."""
    lead = labels.shape
    logprobs, entropy = _HeadLogprobs.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), 1.0 / temperature, with_entropy, product
    )
    return logprobs.view(lead), entropy.view(lead) if with_entropy else None


class HeadProduct(Product):
    """The LM head's block products for ``head_logprobs`` through oneDNN: ``[rows, H] @ [H, V]`` for the logits
    and ``[rows, V] @ [V, H]`` for the gradient of the hidden states. Each block is padded to ``padded_rows`` rows
    so a run meets a bounded set of kernel shapes (one per row count, kept by oneDNN)."""

    def mm(self, a: torch.Tensor, b: torch.Tensor, slot: int) -> torch.Tensor:
        return onednn.mm(a, b)

    def rows(self, m: int) -> int:
        return onednn.padded_rows(m)


def head_product(head: nn.Module) -> HeadProduct | None:
    """``HeadProduct`` for an LM head whose fp32 CPU products take oneDNN here now (a layer ``fast_linears``
    swapped, oneDNN measured faster at its shape with or without gradients as they are now); else None (the
    default products)."""
    swapped = isinstance(head, onednn.OneDNNLinear) and head.bias is None
    if swapped and onednn.onednn_ready() and onednn.takes_onednn(head):
        return HeadProduct()
    return None
