"""Forward passes shared by the trainers: per-token log-probs of response tokens, sequence sums.

Shapes: a ``SequenceBatch`` is ``[B, L]``; outputs are aligned with the *predicted* tokens, i.e.
position ``t`` of the output is about token ``t + 1`` of the input (``[B, L-1]``).
"""

from __future__ import annotations

import torch

from rlhfkit.data.collate import SequenceBatch
from rlhfkit.models.packing import can_pack, pack
from rlhfkit.ops import entropy_from_logits, logprobs_from_logits


def next_token_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, pack_rows: bool = False) -> torch.Tensor:
    """``[B, L-1, V]`` logits predicting tokens 1..L-1 of each (right-padded) row. ``pack_rows``: run the model
    on packed rows where that is cheaper (``rlhfkit.models.packing``; the same logits on every real position)."""
    # packing reads the config of the model inside any DDP / PEFT wrapper itself (lora.base_model)
    packed = pack(model, input_ids, attention_mask) if pack_rows and can_pack(model) else None
    if packed is None:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    out = model(**packed.model_inputs(model))
    return packed.gather(out.logits, 0, input_ids.shape[1] - 1)


def token_logprobs(model, batch: SequenceBatch, temperature: float = 1.0, with_entropy: bool = False,
                   pack_rows: bool = False):
    """Log-probs ``[B, L-1]`` of each next token, its mask ``[B, L-1]`` (1 on response tokens), and
    optionally the entropy ``[B, L-1]`` of the next-token distribution."""
    logits = next_token_logits(model, batch.input_ids, batch.attention_mask, pack_rows).float()
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = logprobs_from_logits(logits, batch.input_ids[:, 1:])
    mask = batch.response_mask[:, 1:].to(logprobs.dtype)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return logprobs, mask, entropy


def sequence_logprobs(model, batch: SequenceBatch, pack_rows: bool = False) -> torch.Tensor:
    """``[B]`` sum of log-probs over each row's response tokens (DPO's log pi(y|x))."""
    logprobs, mask, _ = token_logprobs(model, batch, pack_rows=pack_rows)
    return (logprobs * mask).sum(dim=1)
