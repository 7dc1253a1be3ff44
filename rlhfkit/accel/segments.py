"""Attention on packed rows over each query's own keys, instead of over the whole row under a mask.

A packed row holds a shared trunk, prompts and responses, and its block mask lets a response token attend to its
trunk, its prompt and its own earlier tokens only: in a GRPO row of several hundred positions a response token
may see a few dozen. PyTorch's fused attention runs the full ``[C, C]`` score matrix per row and head whatever the
mask, so most of its work is on pairs the mask then discards. Here the row's positions are split into segments
(runs of queries whose allowed keys grow by the query itself, cut into pieces of at most ``SEGMENT_QUERIES``),
and each segment attends to its last query's keys only: a batch of small ``[queries, keys]`` attentions, each
with its slice of the mask, gathered from and scattered back to the packed rows. Every query attends to the
same keys with the same weights as under the full mask (the outputs differ by the order of float sums), and
free positions (no token; their outputs are never read) get zeros.

The segments are used on the CPU where they cover fewer than ``MAX_COVER`` of the row's score matrix, through
``PackedBatch.run`` (which routes the model's sdpa attention here for the length of its forward), and not under
gradient checkpointing (its recomputation runs outside that forward).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SEGMENT_QUERIES = 32  # queries per segment at most: shorter pieces trim the keys of the first ones
MAX_COVER = 0.5  # use segments only where their padded score matrices cover less than this share of the rows'


@dataclass
class Segments:
    """The gather / scatter plan of a packed batch's attention (``R x C`` flat positions)."""

    queries: torch.Tensor  # [S, Lq] flat position of each segment's queries (0 on padding)
    keys: torch.Tensor  # [S, Lk] flat position of each segment's keys (0 on padding)
    allowed: torch.Tensor  # [S, 1, Lq, Lk] the packed mask at those queries and keys; a padding query sees key 0
    back: torch.Tensor  # [R * C] where each flat position's output is in the [S * Lq] outputs (S * Lq: zeros)


def plan(allowed: torch.Tensor, used: torch.Tensor) -> Segments | None:
    """Segments for a packed mask ``allowed`` ``[R, 1, C, C]`` (True = may attend) with ``used`` ``[R, C]`` the
    positions that hold a token; None when they would not cover less than ``MAX_COVER`` of the score matrices."""
    rows, _, width, _ = allowed.shape
    mask = allowed[:, 0]
    # query c continues the segment of c - 1 when its keys are c - 1's and itself
    before = mask[:, :-1].clone()
    step = torch.arange(width - 1, device=mask.device)
    before[:, step, step + 1] = True
    continues = torch.zeros(rows, width, dtype=torch.bool, device=mask.device)
    continues[:, 1:] = (mask[:, 1:] == before).all(-1)
    pieces = []  # (row, first, stop)
    for r, (u, c) in enumerate(zip(used.tolist(), continues.tolist())):
        q = 0
        while q < width:
            if not u[q]:
                q += 1
                continue
            first, q = q, q + 1
            while q < width and u[q] and c[q]:
                q += 1
            pieces += [(r, a, min(a + SEGMENT_QUERIES, q)) for a in range(first, q, SEGMENT_QUERIES)]
    keys = [mask[r, stop - 1].nonzero().flatten() for r, _, stop in pieces]
    n_queries = max(stop - first for _, first, stop in pieces)
    n_keys = max(len(k) for k in keys)
    if len(pieces) * n_queries * n_keys >= MAX_COVER * rows * width * width:
        return None
    device, S = mask.device, len(pieces)
    queries = torch.zeros(S, n_queries, dtype=torch.long, device=device)
    key_index = torch.zeros(S, n_keys, dtype=torch.long, device=device)
    seg_allowed = torch.zeros(S, 1, n_queries, n_keys, dtype=torch.bool, device=device)
    seg_allowed[:, :, :, 0] = True  # padding queries: one key, so no softmax row is empty
    back = torch.full((rows * width,), S * n_queries, dtype=torch.long, device=device)
    for s, ((r, first, stop), k) in enumerate(zip(pieces, keys)):
        n = stop - first
        at = r * width + torch.arange(first, stop, device=device)
        queries[s, :n] = at
        key_index[s, : len(k)] = r * width + k
        seg_allowed[s, 0, :n] = False
        seg_allowed[s, 0, :n, : len(k)] = mask[r, first:stop][:, k]
        back[at] = s * n_queries + torch.arange(n, device=device)
    return Segments(queries, key_index, seg_allowed, back)


def attend(segments: Segments, query, key, value, scaling: float | None) -> torch.Tensor:
    """Attention of ``query`` ``[R, H, C, D]`` over ``key`` / ``value`` ``[R, Hkv, C, D]`` by segments; returns
    ``[R, C, H, D]`` (the layout transformers' attention functions return)."""
    R, H, C, D = query.shape
    S, Lq = segments.queries.shape
    Lk = segments.keys.shape[1]

    def take(x: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
        flat = x.transpose(1, 2).reshape(R * C, x.shape[1], D)
        return flat.index_select(0, index.reshape(-1)).view(S, n, x.shape[1], D).transpose(1, 2)

    q = take(query, segments.queries, Lq)
    k, v = take(key, segments.keys, Lk), take(value, segments.keys, Lk)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=segments.allowed, scale=scaling, enable_gqa=key.shape[1] != H
    )  # [S, H, Lq, D]
    out = torch.cat([out.transpose(1, 2).reshape(S * Lq, H, D), out.new_zeros(1, H, D)])
    return out.index_select(0, segments.back).view(R, C, H, D)


def whole_rows(mask: torch.Tensor, query, key, value, scaling: float | None) -> torch.Tensor:
    """Attention over the whole packed rows under ``mask``, each key / value head read by its group of query
    heads where there are fewer (grouped-query attention) instead of copied out to one per query head first, as
    transformers' sdpa attention does under a mask: the copies would be kept for backward, (1 - 1/groups) of the keys'
    and values' memory at ``groups`` query heads per key head. Outputs equal transformers' bit for bit; the keys' and
    values' gradients sum the group's heads in another order. Returns ``[R, C, H, D]``."""
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )
    return out.transpose(1, 2).contiguous()


@contextlib.contextmanager
def routed(mask: torch.Tensor, segments: Segments | None):
    """For the length of the block: transformers' sdpa attention, called with ``mask`` (the packed rows' own
    mask tensor), attends by ``segments`` (None: over the whole rows, ``whole_rows``); any other call runs as
    before."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    stock = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        plain = (
            attention_mask is None
            or attention_mask.data_ptr() != mask.data_ptr()
            or attention_mask.shape != mask.shape
            or dropout
            or kwargs.get("softcap") is not None
            or kwargs.get("s_aux") is not None
            or query.shape[2] != mask.shape[-2]
            or key.shape[2] != mask.shape[-1]
        )
        if plain:
            return stock(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        if segments is None:
            return whole_rows(mask, query, key, value, scaling), None
        return attend(segments, query, key, value, scaling), None

    local = getattr(ALL_ATTENTION_FUNCTIONS, "_local_mapping", None)
    if not isinstance(local, dict):  # a transformers whose interface is built otherwise: the stock attention
        yield
        return
    had_local = "sdpa" in local
    local["sdpa"] = attention
    try:
        yield
    finally:
        if had_local:
            local["sdpa"] = stock
        else:
            del local["sdpa"]
