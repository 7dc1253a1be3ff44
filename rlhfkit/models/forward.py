"""Forward passes shared by the trainers: per-token log-probs of response tokens, sequence sums.

Two layouts:
- a ``SequenceBatch`` is right-padded ``[B, L]`` prompt + response rows; outputs are aligned with the
  *predicted* tokens, i.e. position ``t`` of the output is about token ``t + 1`` of the input (``[B, L-1]``);
- online RL lays rows out as ``[left-padded prompt (P) | right-padded response (T)]``, position ids counted
  from the attention mask so left padding changes nothing; outputs are ``[B, T]`` over response tokens.
Given a ``PackedBatch`` of the same batch (``rlhfkit.accel.packing``), a model runs on the packed rows and
the outputs are gathered back into the padded layout: the same numbers from fewer positions.
"""

from __future__ import annotations

import torch

from rlhfkit.accel import vocab
from rlhfkit.accel.packing import PackedBatch, can_pack, pack_batch, prompt_first, split_head
from rlhfkit.data.collate import SequenceBatch


def next_token_logits(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, pack_sequences: bool = False
) -> torch.Tensor:
    """``[B, L-1, V]`` logits predicting tokens 1..L-1 of each (right-padded) row. ``pack_sequences``: run the model
    on packed rows where that is cheaper (``rlhfkit.accel.packing``; the same logits on every real position)."""
    # packing reads the config of the model inside any DDP / PEFT wrapper itself (lora.base_model)
    packed = pack_batch(model, input_ids, attention_mask) if pack_sequences and can_pack(model) else None
    if packed is None:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    out = packed.run(model)
    return packed.gather(out.logits, 0, input_ids.shape[1] - 1)


def token_logprobs(
    model, batch: SequenceBatch, temperature: float = 1.0, with_entropy: bool = False, pack_sequences: bool = False
):
    """Log-probs ``[B, L-1]`` of each next token, its mask ``[B, L-1]`` (1 on response tokens), and
    optionally the entropy ``[B, L-1]`` of the next-token distribution."""
    logits = next_token_logits(model, batch.input_ids, batch.attention_mask, pack_sequences).float()
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = vocab.logprobs(logits, batch.input_ids[:, 1:])
    mask = batch.response_mask[:, 1:].to(logprobs.dtype)
    entropy = vocab.entropy(logits) if with_entropy else None
    return logprobs, mask, entropy


def labelled_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    pack_sequences: bool = False,
    response_mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Log-probs ``[N]`` of the next tokens at the ``N`` positions where ``mask [B, L-1]`` is true (row-major order)
    of right-padded ``[B, L]`` rows, the LM head run on those positions only, a block at a time (``fused_head``):
    the ``[B, L-1, V]`` logits of every prompt and padding position are never built. None where the plain path
    (``next_token_logits``) must run: logits within one block, a LoRA-adapted or biased head, a model whose
    forward is intercepted. The same numbers as ``logprobs_from_logits`` on ``next_token_logits``.
    ``response_mask`` ``[B, L]`` (with ``mask`` its labelled response tokens): packed, rows with the same prompt
    tokens (a preference pair's chosen and rejected replies) then share one copy of the prompt."""
    fused = fused_head(model, mask.numel())  # the logits the plain path would build
    if fused is None:
        return None
    body, weight, product = fused
    packed = None
    if pack_sequences and can_pack(model):
        if response_mask is None:
            packed = pack_batch(model, input_ids, attention_mask)
        else:  # [left-padded prompt | response]: the layout whose prompts can be shared
            ids, attn, width, _ = prompt_first(input_ids, attention_mask, response_mask, 0)
            packed = pack_batch(model, ids, attn, prompt_width=width)
            if packed is not None:  # (else the padded rows as they came: no wider than the relayout)
                columns = torch.arange(ids.shape[1], device=ids.device)
                input_ids, attention_mask = ids, attn
                mask = (attn.bool() & (columns >= width))[:, 1:]  # each row's labels, in the same order
    states = stack_states(model, body, input_ids, attention_mask, 0, input_ids.shape[1] - 1, packed)
    return vocab.head_logprobs(states[mask], weight, input_ids[:, 1:][mask], product=product)[0]


def sequence_logprobs(model, batch: SequenceBatch, pack_sequences: bool = False) -> torch.Tensor:
    """``[B]`` sum of log-probs over each row's response tokens (DPO's log pi(y|x)); packed, rows with one prompt
    share it (``labelled_logprobs``)."""
    mask = batch.response_mask[:, 1:].bool()
    logprobs = labelled_logprobs(
        model, batch.input_ids, batch.attention_mask, mask, pack_sequences, response_mask=batch.response_mask
    )
    if logprobs is not None:
        rows = mask.nonzero()[:, 0]
        return torch.zeros(mask.shape[0], dtype=logprobs.dtype, device=logprobs.device).index_add(0, rows, logprobs)
    logprobs, mask, _ = token_logprobs(model, batch, pack_sequences=pack_sequences)
    return (logprobs * mask).sum(dim=1)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` positions counted over real tokens (0 for left padding), as generation uses them."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def response_logits(
    model, input_ids, attention_mask, n_response: int, hidden: bool = False, packed: PackedBatch | None = None
):
    """Logits ``[B, T, V]`` predicting the T response tokens (and the last hidden states ``[B, T, H]``)."""
    L = input_ids.shape[1]
    if packed is not None:
        return packed.causal_lm_outputs(model, L - n_response - 1, L - 1, hidden)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        output_hidden_states=hidden,
        logits_to_keep=n_response + 1,
    )
    logits = out.logits[:, -(n_response + 1) : -1]  # position t predicts token t + 1
    states = out.hidden_states[-1][:, -(n_response + 1) : -1] if hidden else None
    return logits, states


def stack_states(model, body, input_ids, attention_mask, start: int, stop: int, packed: PackedBatch | None = None):
    """The transformer stack's last hidden states ``[B, stop-start, H]`` at columns ``start:stop`` of the padded
    rows, run on ``packed`` rows when given. Positions count real tokens (``position_ids``), as generation does;
    for right-padded rows that is the default numbering on every real token."""
    if packed is not None:
        return packed.gather(packed.run(body, model).last_hidden_state, start, stop)
    out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
    return out.last_hidden_state[:, start:stop]


def fused_head(model, n_rows: int):
    """The transformer stack, the LM head's weight and the way its block products run (``vocab.Product``:
    oneDNN's where the head was swapped to it) when the log-probs of ``n_rows`` positions should be taken without
    building their logits (``rlhfkit.accel.vocab.head_logprobs``): when the block-wise path applies to those
    logits (``vocab.blocks_apply``) and the head is a plain bias-free linear layer; else None."""
    parts = split_head(model)
    if parts is None:
        return None
    body, head = parts
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None  # e.g. a LoRA-adapted head: its own forward must run
    if not vocab.blocks_apply(n_rows * head.out_features, head.weight.device):
        return None
    return body, head.weight, vocab.head_product(head) or vocab.PLAIN


def response_token_stats(
    model,
    input_ids,
    attention_mask,
    n_response: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    hidden: bool = False,
    packed: PackedBatch | None = None,
):
    """Log-probs of the T response tokens of ``[left-padded prompt | response]`` rows, their entropies (or None)
    and the last hidden states there (or None), ``[B, T]``, ``[B, T]``, ``[B, T, H]``. At a real vocabulary the
    LM head and the log-probs run together a block of positions at a time (``fused_head``), so the ``[B, T, V]``
    logits are never built; the numbers are the same."""
    labels = input_ids[:, -n_response:]
    fused = fused_head(model, labels.numel())
    if fused is None:
        logits, states = response_logits(model, input_ids, attention_mask, n_response, hidden=hidden, packed=packed)
        logits = logits.float()
        if temperature != 1.0:  # at 1 no second [B, T, V] tensor
            logits = logits / temperature
        entropy = vocab.entropy(logits) if with_entropy else None
        return vocab.logprobs(logits, labels), entropy, states
    body, weight, product = fused
    L = input_ids.shape[1]  # position t predicts token t + 1
    states = stack_states(model, body, input_ids, attention_mask, L - n_response - 1, L - 1, packed)
    logprobs, entropy = vocab.head_logprobs(states, weight, labels, temperature, with_entropy, product)
    return logprobs, entropy, states if hidden else None


@torch.no_grad()
def response_logprobs(
    model, input_ids, attention_mask, n_response: int, temperature: float = 1.0, packed: PackedBatch | None = None
) -> torch.Tensor:
    """``[B, T]`` log-probs of the T response tokens of ``[left-padded prompt | response]`` rows under
    ``model`` (no gradient): the frozen reference's, or the policy's when measuring KL after training."""
    return response_token_stats(model, input_ids, attention_mask, n_response, temperature, packed=packed)[0]
