"""Sequence packing for teacher-forced forward passes: a padded batch run as fewer, fuller rows.

PPO's batches are ``[left-padded prompt | right-padded response]``: a quarter or more of the positions are
padding, and every matmul of every forward and backward pass pays for them. Packing lays several
sequences end to end in one row. A block-diagonal causal mask lets each token attend only to earlier
tokens of its own sequence, and position ids restart at 0 for each sequence, so every real token's output
is the one the padded batch gives (up to the rounding of reordered float sums).

The price is attention over longer rows (``rows x width^2``), so ``plan_rows`` picks the packing with the
lowest estimated cost and packs only when that saves at least ``MIN_SAVING``. Packing needs the model to take
a ready-made 4-D mask and position ids: the architectures in ``PACKABLE_MODEL_TYPES`` (each checked against
the padded forward in the tests) with ``sdpa`` or ``eager`` attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhfkit.models.unwrap import base_model

PACKABLE_MODEL_TYPES = frozenset({"gpt2", "llama", "qwen2", "gpt_neox"})
MIN_SAVING = 0.05  # pack only when the estimated cost falls by at least 5%
# Attention costs ~ width / (SPAN_PER_HIDDEN * hidden) of a token's matmuls per position (fitted on small GPT-2
# shapes with the CPU sdpa kernel; it only steers the choice of the row width).
SPAN_PER_HIDDEN = 3
# In 16-bit compute, row widths are rounded up to a multiple of this, so a run meets a handful of distinct
# shapes: oneDNN's bf16 CPU matmuls build and cache a kernel per shape (exact widths held ~150 MB more over
# a 20-step PPO run of a 7.5M-parameter model), and GPU tensor cores favour multiples of 8. In fp32 the
# linear layers bound their own shapes (``rlhfkit.accel.kernels.padded_rows``), so rows are exactly as wide
# as their longest load and attention sees no extra positions.
ROW_MULTIPLE = 8


def row_multiple(model, device: torch.device) -> int:
    """``ROW_MULTIPLE`` when ``model`` computes in 16-bit floats here (autocast on, or 16-bit weights), else 1."""
    if torch.is_autocast_enabled(device.type):
        return ROW_MULTIPLE
    weight = next(base_model(model).parameters(), None)
    return ROW_MULTIPLE if weight is not None and weight.dtype in (torch.float16, torch.bfloat16) else 1


def _row_width(loads: list[int], multiple: int) -> int:
    return -(-max(loads) // multiple) * multiple


def _config(model):
    return base_model(model).config


def can_pack(model) -> bool:
    """Whether ``model``'s forward gives the same outputs on packed rows (see the module docstring)."""
    config = _config(model)
    return (
        config.model_type in PACKABLE_MODEL_TYPES
        and not config.is_encoder_decoder
        and getattr(config, "_attn_implementation", None) in ("sdpa", "eager")
    )


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


def plan_rows(lengths: list[int], padded_width: int, hidden_size: int, multiple: int = 1) -> list[list[int]] | None:
    """Rows of sequence indices for packing, or None when the padded batch is as cheap.

    ``lengths``: real tokens of each sequence; ``padded_width``: the padded batch's width. Cost of a layout
    with R rows of width C (rounded up to ``multiple``): ``R * C * (1 + C / span)``, span = SPAN_PER_HIDDEN x
    hidden size (matmuls per position plus attention per pair of positions). Tries ~33 widths from the longest
    sequence to twice it and wider ones that fill 1, 2, ... rows evenly, each packed first-fit decreasing."""
    longest, total, span = max(lengths), sum(lengths), SPAN_PER_HIDDEN * hidden_size

    def cost(rows: int, width: int) -> float:
        return rows * width * (1.0 + width / span)

    padded = cost(len(lengths), padded_width)
    step = max(1, longest // 32)  # at most ~33 widths between the longest sequence and twice it
    wide = range(1, -(-total // (2 * longest)) + 1)  # rows of a width beyond twice the longest
    widths = {*range(longest, 2 * longest + 1, step), *(-(-total // r) for r in wide)}
    best, best_cost = None, padded * (1.0 - MIN_SAVING)
    for capacity in sorted(w for w in widths if w >= longest):
        rows = _first_fit_decreasing(lengths, capacity)
        width = _row_width([sum(lengths[i] for i in row) for row in rows], multiple)
        if cost(len(rows), width) < best_cost:
            best, best_cost = rows, cost(len(rows), width)
    return best


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

    def gather(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Packed outputs ``[R, C, ...]`` -> the padded layout's columns ``start:stop``, ``[B, stop-start, ...]``.
        Padding positions get the value at flat position 0: finite, and masked by the caller."""
        flat = x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
        index = self.index[:, start:stop]
        # index_select: its backward is one index_add (advanced indexing's is a slower index_put)
        return flat.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[2:])


def pack_batch(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_id: int = 0) -> PackedBatch | None:
    """Pack a padded batch for ``model`` (see ``can_pack``), or None when packing would not pay off.

    ``input_ids``, ``attention_mask``: ``[B, L]``; the real tokens of a row are those with mask 1, in order.
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
    rows = plan_rows(lengths, mask.shape[1], config.hidden_size, multiple)
    if rows is None:
        return None
    width = _row_width([sum(lengths[i] for i in row) for row in rows], multiple)
    # Start of each sequence in the flat [R * C] layout.
    start = [0] * B
    for r, row in enumerate(rows):
        offset = r * width
        for i in row:
            start[i] = offset
            offset += lengths[i]
    seq, col = mask.nonzero(as_tuple=True)  # real tokens, row by row, in order
    rank = (mask.cumsum(1) - 1)[seq, col]  # position within its sequence
    dst = torch.tensor(start, device=device)[seq] + rank  # [N]
    n_flat = len(rows) * width
    ids = torch.full((n_flat,), pad_id, dtype=input_ids.dtype, device=device)
    ids[dst] = input_ids[seq, col]
    positions = torch.zeros(n_flat, dtype=torch.long, device=device)
    positions[dst] = rank
    # Segment of each packed position: its sequence, or a segment of its own for a free position (so no
    # query row of the mask is empty: a fully masked softmax row would give NaN).
    segment = -1 - torch.arange(n_flat, device=device)
    segment[dst] = seq
    segment = segment.view(len(rows), width)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal  # [R, C, C]
    index = torch.zeros(mask.shape, dtype=torch.long, device=device)
    index[seq, col] = dst
    return PackedBatch(ids.view(len(rows), width), positions.view(len(rows), width), allowed[:, None], index)
