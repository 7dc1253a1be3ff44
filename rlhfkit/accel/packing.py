"""Sequence packing for teacher-forced forward passes: a padded batch run as fewer, fuller rows.

PPO's batches are ``[left-padded prompt | right-padded response]``: a quarter or more of the positions are
padding, and every matmul of every forward and backward pass pays for them. Packing lays several
sequences end to end in one row. A block-diagonal causal mask lets each token attend only to earlier
tokens of its own sequence, and position ids restart at 0 for each sequence, so every real token's output
is the one the padded batch gives (up to the rounding of reordered float sums).

Online RL samples G completions per prompt, so a batch holds each prompt G times. Given the prompt width,
rows with the same prompt can share one copy of it: the prompt's tokens are laid out once and then each
row's response, with a mask that lets a response attend to the prompt and to its own earlier tokens only.
The outputs are again the padded batch's, from up to (G - 1) x prompt fewer positions per group.

Rows often begin alike even where their prompts differ: a chat template's system message (tens of tokens
in some templates) and the user turn's header open every prompt. The leading tokens that every row of a batch
has in common, the trunk, are laid out once at the start of each packed row, and every sequence in the row
attends to that copy.

In a causal LM's packed pass the LM head (a hidden x vocab matmul per position) runs on the positions whose
logits are used only (``PackedBatch.causal_lm_outputs``), not on prompts or free positions.

The price is attention over longer rows (``rows x width^2`` under the mask), so ``pack_batch`` picks the
packing with the lowest estimated cost (``plan_rows`` for a set of sequences alone) and packs only when that
saves at least ``MIN_SAVING``. Packing needs the model to take a ready-made 4-D mask and position ids: the
architectures in ``PACKABLE_MODEL_TYPES`` (each checked against the padded forward in the tests) with ``sdpa`` or
``eager`` attention.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlhfkit.accel.base import choices, forward_intercepted
from rlhfkit.accel.onednn import onednn_layers, padded_rows
from rlhfkit.models.unwrap import base_model, without_ddp

PACKABLE_MODEL_TYPES = frozenset({"gpt2", "llama", "qwen2", "gpt_neox"})
MIN_SAVING = 0.05  # pack only when the estimated cost falls by at least 5%
# Attention costs ~ width / (SPAN_PER_HIDDEN * hidden) of a token's matmuls per position (fitted on small GPT-2
# shapes with the CPU sdpa kernel; it only steers the choice of the row width).
SPAN_PER_HIDDEN = 3
# In 16-bit compute, row widths are rounded up to a multiple of this, so a run meets a handful of distinct
# shapes: oneDNN's bf16 CPU matmuls build and cache a kernel per shape, so exact widths would grow that cache
# over a run. In fp32 the linear layers bound their own shapes (``rlhfkit.accel.onednn.padded_rows``), so rows
# are exactly as wide
# as their longest load, or a few positions wider where that gives the oneDNN layers a row count they take
# as it is (``_onednn_width``).
ROW_MULTIPLE = 8


def row_multiple(model, device: torch.device) -> int:
    """``ROW_MULTIPLE`` when ``model`` computes in 16-bit floats here (autocast on, or 16-bit weights), else 1."""
    if torch.is_autocast_enabled(device.type):
        return ROW_MULTIPLE
    weight = next(base_model(model).parameters(), None)
    return ROW_MULTIPLE if weight is not None and weight.dtype in (torch.float16, torch.bfloat16) else 1


def _row_width(loads: list[int], multiple: int) -> int:
    return -(-max(loads) // multiple) * multiple


def _onednn_width(model, rows: int, width: int) -> int:
    """``width``, or a little wider where that makes ``rows x width`` positions one of the row counts the
    model's oneDNN linear layers run as they are (``onednn.padded_rows``): they would pad their input to that
    count themselves, a zero-filled copy of it in every layer of every pass. The extra positions are free ones."""
    if not onednn_layers(model):
        return width
    target = padded_rows(rows * width)
    wider = -(-target // rows)
    return wider if rows * wider == target else width


def _config(model):
    return base_model(model).config


def can_pack(model) -> bool:
    """Whether to run ``model``'s teacher-forced passes on packed rows: packing is on for the device the model is
    on (``rlhfkit.accel.choices``: the CPU, under ``--accel auto``) and the model's forward gives the same outputs
    on packed rows (see the module docstring)."""
    config = _config(model)
    weight = next(base_model(model).parameters(), None)
    return (
        choices(weight.device if weight is not None else None).packing
        and config.model_type in PACKABLE_MODEL_TYPES
        and not config.is_encoder_decoder
        and getattr(config, "_attn_implementation", None) in ("sdpa", "eager")
    )


def split_head(model) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The transformer stack and the LM head of a packable causal LM, so that the head (a ``hidden x vocab``
    matmul per position) can run on the positions whose logits are used only; None when the model's own
    forward must run (a hook on it or a forward replaced on the instance, which calling its parts would skip)."""
    wrapper, base = without_ddp(model), base_model(model)
    body = getattr(base, getattr(base, "base_model_prefix", ""), None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if base.config.model_type not in PACKABLE_MODEL_TYPES or body is None or head is None:
        return None
    return None if forward_intercepted(wrapper, base, body) else (body, head)


def _first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    rows: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, load in enumerate(loads):
            if load + lengths[i] <= capacity:
                rows[r].append(i)
                loads[r] += lengths[i]
                break
        else:
            rows.append([i])
            loads.append(lengths[i])
    return rows


def _cost(rows: int, width: int, span: int) -> float:
    """Estimated cost of ``rows`` rows of ``width`` positions: matmuls per position plus attention per pair."""
    return rows * width * (1.0 + width / span)


def _pays_off(cost: float, padded_rows: int, padded_width: int, span: int) -> bool:
    """Whether a layout of this estimated cost saves at least ``MIN_SAVING`` against the padded batch."""
    return cost < _cost(padded_rows, padded_width, span) * (1.0 - MIN_SAVING)


def _best_layout(lengths: list[int], multiple: int, span: int, trunk: int = 0) -> tuple[list[list[int]], float]:
    """The cheapest rows for sequences of ``lengths`` (see ``plan_rows``) and their cost; every row starts with
    ``trunk`` positions that its sequences share."""
    longest, total = max(lengths), sum(lengths)
    step = max(1, longest // 16)  # at most ~17 widths between the longest sequence and twice it
    wide = range(1, -(-total // (2 * longest)) + 1)  # rows of a width beyond twice the longest
    widths = {*range(longest, 2 * longest + 1, step), *(-(-total // r) for r in wide)}
    best, best_cost = None, float("inf")
    for capacity in sorted(w for w in widths if w >= longest):
        rows = _first_fit_decreasing(lengths, capacity)
        width = _row_width([trunk + sum(lengths[i] for i in row) for row in rows], multiple)
        if _cost(len(rows), width, span) < best_cost:
            best, best_cost = rows, _cost(len(rows), width, span)
    return best, best_cost


def plan_rows(lengths: list[int], padded_width: int, hidden_size: int, multiple: int = 1) -> list[list[int]] | None:
    """Rows of sequence indices for packing, or None when the padded batch is as cheap.

    ``lengths``: real tokens of each sequence; ``padded_width``: the padded batch's width. Cost of a layout
    with R rows of width C (rounded up to ``multiple``): ``R * C * (1 + C / span)``, span = SPAN_PER_HIDDEN x
    hidden size (matmuls per position plus attention per pair of positions). Tries ~17 widths from the longest
    sequence to twice it and wider ones that fill 1, 2, ... rows evenly, each packed first-fit decreasing."""
    span = SPAN_PER_HIDDEN * hidden_size
    rows, cost = _best_layout(lengths, multiple, span)
    return rows if _pays_off(cost, len(lengths), padded_width, span) else None


def shared_prompts(input_ids: torch.Tensor, mask: torch.Tensor, prompt_width: int) -> list[list[int]]:
    """Rows grouped by identical prompts (the first ``prompt_width`` columns, real tokens only), each group in
    row order; every row alone when ``prompt_width`` is 0."""
    if prompt_width == 0:
        return [[i] for i in range(input_ids.shape[0])]
    key = torch.where(mask[:, :prompt_width], input_ids[:, :prompt_width], -1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    groups: dict[int, list[int]] = {}
    for row, group in enumerate(inverse.tolist()):
        groups.setdefault(group, []).append(row)
    return list(groups.values())


def common_prefix(input_ids: torch.Tensor, mask: torch.Tensor, limit: int) -> int:
    """How many leading real tokens every row has in common (the same ids at the same places), at most ``limit``."""
    if limit <= 0 or input_ids.shape[0] < 2:
        return 0
    seq, col = mask.nonzero(as_tuple=True)
    rank = (mask.cumsum(1) - 1)[seq, col]
    lead = rank < limit
    aligned = torch.full((input_ids.shape[0], limit), -1, dtype=input_ids.dtype, device=input_ids.device)
    aligned[seq[lead], rank[lead]] = input_ids[seq[lead], col[lead]]
    same = (aligned == aligned[:1]).all(0) & (aligned[0] >= 0)
    return int(same.long().cumprod(0).sum())


def _chunk_sizes(largest_group: int) -> list[int]:
    """How many rows may share one copy of their prompt: 1 (no sharing), 2, 4, ... and the whole group."""
    sizes, size = [1], 2
    while size < largest_group:
        sizes.append(size)
        size *= 2
    return sorted({*sizes, largest_group})


@dataclass
class PackedBatch:
    """A padded ``[B, L]`` batch laid out as ``[R, C]`` packed rows, and the map back."""

    input_ids: torch.Tensor  # [R, C] sequences end to end; free positions hold the pad id
    position_ids: torch.Tensor  # [R, C] 0, 1, ... within each sequence
    allowed: torch.Tensor  # [R, 1, C, C] block-diagonal causal mask, True = may attend
    index: torch.Tensor  # [B, L] flat position in R*C of each padded position (0 on padding)

    def mask_for(self, model) -> torch.Tensor:
        """The 4-D attention mask in the form ``model``'s attention takes: bool (sdpa) or additive (eager)."""
        if _config(model)._attn_implementation == "eager":
            return torch.zeros(self.allowed.shape, device=self.allowed.device).masked_fill(
                ~self.allowed, torch.finfo(torch.float32).min
            )
        return self.allowed

    def model_inputs(self, model) -> dict[str, torch.Tensor]:
        """Keyword arguments that run ``model`` (a causal LM, a backbone, a classifier) on the packed rows."""
        return {"input_ids": self.input_ids, "attention_mask": self.mask_for(model), "position_ids": self.position_ids}

    def run(self, module, model=None, **kwargs):
        """``module(**self.model_inputs(model), **kwargs)``: ``module`` (a model or its transformer stack) on the
        packed rows, ``model`` (default ``module``) the one whose config the inputs follow; its sdpa attention
        reads grouped-query heads in place (``whole_rows``)."""
        model = module if model is None else model
        with self._attention(model):
            return module(**self.model_inputs(model), **kwargs)

    def _attention(self, model):
        if (
            not choices(self.input_ids.device).packing
            or _config(model)._attn_implementation != "sdpa"
            or any(getattr(m, "gradient_checkpointing", False) for m in base_model(model).modules())
        ):
            return contextlib.nullcontext()
        return routed(self.allowed)

    def causal_lm_outputs(self, model, start: int, stop: int, hidden: bool = False):
        """Run causal LM ``model`` on the packed rows; its logits ``[B, stop-start, V]`` at the padded layout's
        columns ``start:stop`` (and the last hidden states there, or None). The LM head runs on those
        positions only where the model allows it (``split_head``), not on every packed position."""
        parts = split_head(model)
        if parts is None:
            out = self.run(model, output_hidden_states=hidden)
            states = self.gather(out.hidden_states[-1], start, stop) if hidden else None
            return self.gather(out.logits, start, stop), states
        body, head = parts
        states = self.gather(self.run(body, model).last_hidden_state, start, stop)
        return head(states), states if hidden else None

    def gather(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Packed outputs ``[R, C, ...]`` -> the padded layout's columns ``start:stop``, ``[B, stop-start, ...]``.
        Padding positions get the value at flat position 0: finite, and masked by the caller."""
        flat = x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
        index = self.index[:, start:stop]
        # index_select: its backward is one index_add (advanced indexing's is a slower index_put)
        return flat.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[2:])


def pack_batch(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_id: int = 0, prompt_width: int = 0
) -> PackedBatch | None:
    """Pack a padded batch for ``model`` (see ``can_pack``), or None when packing would not pay off.

    ``input_ids``, ``attention_mask``: ``[B, L]``; the real tokens of a row are those with mask 1, in order.
    ``prompt_width``: rows are ``[left-padded prompt (prompt_width columns) | response]``, and rows with
    the same prompt (the G completions of a group) may share one copy of it: the prompt's tokens are laid
    out once, followed by each row's response, and the mask lets each response attend to the prompt and to
    its own earlier tokens only, so every output is the one the padded batch gives, from fewer positions.
    How many rows share a copy (1 = none) is chosen with the row layout, by the same cost estimate.
    The leading tokens that all rows share (``common_prefix``, within the prompt where ``prompt_width`` is
    given) are laid out once per packed row, before its sequences, and every sequence of the row attends to them.
    Call it where the model will run (inside its autocast context): the row width depends on the precision.
    Position ids in the packed rows count real tokens, as ``(mask.cumsum(1) - 1)`` does in the padded batch."""
    config = _config(model)
    mask = attention_mask.bool()
    lengths = mask.sum(1).tolist()
    window = getattr(config, "sliding_window", None)
    if min(lengths) == 0 or (window and getattr(config, "use_sliding_window", True) and max(lengths) > window):
        return None  # an empty row has no token to pack; a sliding window must not cut a sequence
    device, B = input_ids.device, len(lengths)
    multiple = row_multiple(model, device)
    span = SPAN_PER_HIDDEN * config.hidden_size
    prompt = mask[:, :prompt_width].sum(1).tolist()  # real prompt tokens of each row
    # The trunk: every row's first ``trunk`` tokens, laid out once per packed row. It leaves each row at least
    # one token of its own, and stays within the prompts where rows share them.
    limit = min(lengths) - 1
    trunk = common_prefix(input_ids, mask, min(limit, *prompt) if prompt_width else limit)
    groups = shared_prompts(input_ids, mask, prompt_width)
    candidates = []  # (lower bound of the cost, chunks, chunk lengths) per number of rows sharing a prompt
    for size in _chunk_sizes(max(len(g) for g in groups)):
        chunks = [g[i : i + size] for g in groups for i in range(0, len(g), size)]
        # a chunk: its prompt after the trunk, once, then each member's tokens after its prompt (and the trunk)
        chunk_lengths = [
            max(prompt[c[0]] - trunk, 0) + sum(lengths[i] - max(prompt[i], trunk) for i in c) for c in chunks
        ]
        # no layout of these chunks beats every position in rows as wide as the longest chunk
        candidates.append((sum(chunk_lengths) * (1.0 + max(chunk_lengths) / span), chunks, chunk_lengths))
    best = None  # (cost, chunks, rows of chunks, chunk lengths)
    for bound, chunks, chunk_lengths in sorted(candidates, key=lambda c: c[0]):
        if best is not None and bound >= best[0]:
            break
        rows, cost = _best_layout(chunk_lengths, multiple, span, trunk)
        if best is None or cost < best[0]:
            best = (cost, chunks, rows, chunk_lengths)
    cost, chunks, rows, chunk_lengths = best
    if not _pays_off(cost, B, mask.shape[1], span):
        return None
    width = _onednn_width(
        model, len(rows), _row_width([trunk + sum(chunk_lengths[c] for c in row) for row in rows], multiple)
    )
    # Where each row's tokens go in the flat [R * C] layout: a trunk token to its packed row's copy of the trunk;
    # the others to its chunk's start, plus (for its response tokens) the responses of the chunk's earlier rows.
    chunk_start = [0] * len(chunks)
    for r, row in enumerate(rows):
        offset = r * width + trunk
        for c in row:
            chunk_start[c] = offset
            offset += chunk_lengths[c]
    start, shift, chunk_of_row = [0] * B, [0] * B, [0] * B
    for c, members in enumerate(chunks):
        earlier = 0
        for i in members:
            start[i], shift[i], chunk_of_row[i] = chunk_start[c], earlier, c
            earlier += lengths[i] - max(prompt[i], trunk)
    seq, col = mask.nonzero(as_tuple=True)  # real tokens, row by row, in order
    rank = (mask.cumsum(1) - 1)[seq, col]  # position within its sequence
    in_trunk = rank < trunk
    in_prompt = (col < prompt_width) & ~in_trunk
    as_tensor = lambda xs: torch.tensor(xs, device=device)  # noqa: E731
    chunk_at = as_tensor(start)[seq]  # [N] where each token's chunk starts; its packed row starts at // width
    dst = torch.where(
        in_trunk,
        chunk_at // width * width + rank,
        chunk_at + rank - trunk + torch.where(in_prompt, 0, as_tensor(shift)[seq]),
    )  # [N]
    n_flat = len(rows) * width
    ids = torch.full((n_flat,), pad_id, dtype=input_ids.dtype, device=device)
    ids[dst] = input_ids[seq, col]  # a shared prompt token is written once per row: the same id
    positions = torch.zeros(n_flat, dtype=torch.long, device=device)
    positions[dst] = rank
    # Chunk of each packed position, or a chunk of its own for a free position (so no query row of the mask
    # is empty: a fully masked softmax row would give NaN); owner: the row of a response token, -1 otherwise.
    chunk = -1 - torch.arange(n_flat, device=device)
    chunk[dst] = as_tensor(chunk_of_row)[seq]
    owner = torch.full((n_flat,), -1, device=device)
    response = ~in_prompt & ~in_trunk
    owner[dst[response]] = seq[response]
    chunk, owner = chunk.view(len(rows), width), owner.view(len(rows), width)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    # query a may attend key b, b not later: b is in the row's trunk, or b is in a's chunk and is a prompt token
    # or a's own row's token
    own = (owner[:, None, :] == -1) | (owner[:, None, :] == owner[:, :, None])
    shared = torch.arange(width, device=device) < trunk  # [C] the trunk's positions, the same in every row
    allowed = (((chunk[:, :, None] == chunk[:, None, :]) & own) | shared) & causal  # [R, C, C]
    index = torch.zeros(mask.shape, dtype=torch.long, device=device)
    index[seq, col] = dst
    return PackedBatch(ids.view(len(rows), width), positions.view(len(rows), width), allowed[:, None], index)


def prompt_first(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Right-padded prompt + response rows ``[B, L]`` laid out as ``[left-padded prompt | right-padded response]``
    (the layout whose rows with one prompt ``pack_batch`` lets share it: a preference pair's chosen and rejected
    replies). Returns the ids, the mask, the prompt width and ``[B]`` how many columns right each row's tokens
    moved; each row's real tokens keep their order."""
    mask = attention_mask.bool()
    response = response_mask.bool() & mask
    prompt_len = (mask & ~response).sum(1)
    B = input_ids.shape[0]
    width = int(prompt_len.max()) if B else 0
    columns = width + (int(response.sum(1).max()) if B else 0)
    seq, col = mask.nonzero(as_tuple=True)
    rank = (mask.cumsum(1) - 1)[seq, col]  # position within the row's real tokens
    shift = width - prompt_len  # the prompt ends at column width - 1, the response follows
    dst = rank + shift[seq]
    ids = torch.full((B, columns), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    out_mask = torch.zeros((B, columns), dtype=attention_mask.dtype, device=attention_mask.device)
    ids[seq, dst] = input_ids[seq, col]
    out_mask[seq, dst] = 1
    return ids, out_mask, width, shift


# ---- attention on packed rows ----------------------------------------------------------------------------------
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
def routed(mask: torch.Tensor):
    """For the length of the block: transformers' sdpa attention, called with ``mask`` (the packed rows' own
    mask tensor), runs as ``whole_rows``; any other call runs as before."""
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
        return whole_rows(mask, query, key, value, scaling), None

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
