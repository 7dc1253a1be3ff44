"""The faster teacher-forced passes: what ``rlhfkit.accel.switched`` installs in place of the plain passes of
``rlhfkit.models.forward`` and ``rlhfkit.models.reward`` (``IMPLEMENTATIONS``), each computing the same numbers.

- Packed rows (``packing.py``): a causal LM, a value model's backbone or a reward model runs on fewer, fuller rows
  where packing is on for its device and that is estimated cheaper (``packed_for``). Rows laid out as
  ``[left-padded prompt | response]`` share each prompt among its completions. One batch is packed once for all
  the models that run on it (the policy, its value model, the reference): the last packing is kept while its
  input tensors live and are unchanged.
- Block-wise vocabulary log-probs (``vocab.py``): log-probs and entropies a block of positions at a time, and at
  a real vocabulary the LM head run a block at a time with them (``fused_head``), so the logits are never built.

Each implementation takes the plain function first and runs it wherever its own path does not apply.
"""

from __future__ import annotations

import weakref

import torch

from rlhfkit.accel import vocab
from rlhfkit.accel.base import setting
from rlhfkit.accel.packing import PackedBatch, can_pack, pack_batch, prompt_first, split_head
from rlhfkit.models import forward, reward
from rlhfkit.models.unwrap import without_ddp

_LAST: dict = {}  # the last packing: its inputs (weakly), its key and the PackedBatch (or None)


def packed_for(model, input_ids, attention_mask, pad_id: int = 0, prompt_width: int = 0) -> PackedBatch | None:
    """``input_ids``, ``attention_mask`` packed for ``model`` (``packing.pack_batch``), or None to run them padded:
    packing off (``--pack-sequences false``, or not on for the device: ``can_pack``) or not estimated cheaper.
    The same input tensors, unchanged, with the same prompt width and precision get the same packing back."""
    if not setting("pack_sequences") or not can_pack(model):
        return None
    key = (prompt_width, input_ids._version, attention_mask._version, torch.is_autocast_enabled(input_ids.device.type))
    ids_ref, mask_ref = _LAST.get("ids"), _LAST.get("mask")
    if ids_ref is not None and ids_ref() is input_ids and mask_ref() is attention_mask and _LAST["key"] == key:
        return _LAST["packed"]
    packed = pack_batch(model, input_ids, attention_mask, pad_id, prompt_width)
    _LAST.update(ids=weakref.ref(input_ids), mask=weakref.ref(attention_mask), key=key, packed=packed)
    return packed


def forget_packing() -> None:
    """Drop the kept packing (a command calls it when it ends)."""
    _LAST.clear()


def fused_head(model, n_rows: int):
    """The transformer stack, the LM head's weight and the way its block products run (``vocab.Product``:
    oneDNN's where the head was swapped to it) when the log-probs of ``n_rows`` positions should be taken without
    building their logits (``vocab.head_logprobs``): when the block-wise path applies to those logits
    (``vocab.blocks_apply``) and the head is a plain bias-free linear layer; else None."""
    parts = split_head(model)
    if parts is None:
        return None
    body, head = parts
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None  # e.g. a LoRA-adapted head: its own forward must run
    if not vocab.blocks_apply(n_rows * head.out_features, head.weight.device):
        return None
    return body, head.weight, vocab.head_product(head) or vocab.PLAIN


def stack_states(model, body, input_ids, attention_mask, start: int, stop: int, packed: PackedBatch | None):
    """The transformer stack's last hidden states ``[B, stop-start, H]`` at columns ``start:stop`` of the padded
    rows, run on ``packed`` rows when given. Positions count real tokens (``forward.position_ids``)."""
    if packed is not None:
        return packed.gather(packed.run(body, model).last_hidden_state, start, stop)
    out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=forward.position_ids(attention_mask))
    return out.last_hidden_state[:, start:stop]


# ---- the implementations -------------------------------------------------------------------------------------
def logprobs(plain, logits, labels):
    return vocab.logprobs(logits, labels)


def entropy(plain, logits):
    return vocab.entropy(logits)


def next_token_logits(plain, model, input_ids, attention_mask):
    # packing reads the config of the model inside any DDP / PEFT wrapper itself (lora.base_model)
    packed = packed_for(model, input_ids, attention_mask)
    if packed is None:
        return plain(model, input_ids, attention_mask)
    return packed.gather(packed.run(model).logits, 0, input_ids.shape[1] - 1)


def labelled_logprobs(plain, model, input_ids, attention_mask, mask, response_mask=None):
    """The LM head run on the labelled positions only, a block at a time (``fused_head``); packed, rows with the
    same prompt tokens (a preference pair's chosen and rejected replies) share one copy of the prompt."""
    fused = fused_head(model, mask.numel())  # the logits the plain path would build
    if fused is None:
        return plain(model, input_ids, attention_mask, mask, response_mask)
    body, weight, product = fused
    if response_mask is None:
        packed = packed_for(model, input_ids, attention_mask)
    elif setting("pack_sequences") and can_pack(model):  # [left-padded prompt | response]: prompts can be shared
        ids, attn, width, _ = prompt_first(input_ids, attention_mask, response_mask, 0)
        packed = packed_for(model, ids, attn, prompt_width=width)
        if packed is not None:  # (else the padded rows as they came: no wider than the relayout)
            columns = torch.arange(ids.shape[1], device=ids.device)
            input_ids, attention_mask = ids, attn
            mask = (attn.bool() & (columns >= width))[:, 1:]  # each row's labels, in the same order
    else:
        packed = None
    states = stack_states(model, body, input_ids, attention_mask, 0, input_ids.shape[1] - 1, packed)
    return vocab.head_logprobs(states[mask], weight, input_ids[:, 1:][mask], product=product)[0]


def response_token_stats(
    plain, model, input_ids, attention_mask, n_response, temperature=1.0, with_entropy=False, hidden=False
):
    """On packed rows where packing applies, the prompts shared; at a real vocabulary the LM head and the log-probs
    together a block of positions at a time (``fused_head``)."""
    L = input_ids.shape[1]  # position t predicts token t + 1
    packed = packed_for(model, input_ids, attention_mask, _pad_id(model), L - n_response)
    labels = input_ids[:, -n_response:]
    fused = fused_head(model, labels.numel())
    if fused is None:
        if packed is None:
            return plain(model, input_ids, attention_mask, n_response, temperature, with_entropy, hidden)
        logits, states = packed.causal_lm_outputs(model, L - n_response - 1, L - 1, hidden)
        logits = logits.float()
        if temperature != 1.0:  # at 1 no second [B, T, V] tensor
            logits = logits / temperature
        return vocab.logprobs(logits, labels), vocab.entropy(logits) if with_entropy else None, states
    body, weight, product = fused
    states = stack_states(model, body, input_ids, attention_mask, L - n_response - 1, L - 1, packed)
    logprobs, entropy = vocab.head_logprobs(states, weight, labels, temperature, with_entropy, product)
    return logprobs, entropy, states if hidden else None


def response_states(plain, backbone, input_ids, attention_mask, n_response):
    L = input_ids.shape[1]
    packed = packed_for(backbone, input_ids, attention_mask, _pad_id(backbone), L - n_response)
    if packed is None:
        return plain(backbone, input_ids, attention_mask, n_response)
    return packed.gather(packed.run(backbone).last_hidden_state, L - n_response - 1, L - 1)


def sequence_scores(plain, model, batch):
    """A decoder reward model on packed rows; rows with the same prompt tokens (a pair's chosen and rejected
    replies) share one copy of them (the reply at each position sees the same tokens)."""
    inner = without_ddp(model)
    if reward.is_encoder(inner) or not setting("pack_sequences") or not can_pack(inner):
        return plain(model, batch)
    pad_id = _pad_id(inner)
    ids, mask, width, shift = prompt_first(batch.input_ids, batch.attention_mask, batch.response_mask, pad_id)
    packed = packed_for(inner, ids, mask, pad_id, prompt_width=width)
    if packed is None:
        return plain(model, batch)
    per_position = reward.head_outputs(inner, lambda: packed.run(model, inner))  # [R, C]
    last = batch.last_token_index()  # [B]
    rows = torch.arange(len(last), device=last.device)
    return per_position.reshape(-1)[packed.index[rows, last + shift]].float()


def _pad_id(model) -> int:
    return getattr(without_ddp(model).config, "pad_token_id", None) or 0


IMPLEMENTATIONS = {
    forward.logprobs: logprobs,
    forward.entropy: entropy,
    forward.next_token_logits: next_token_logits,
    forward.labelled_logprobs: labelled_logprobs,
    forward.response_token_stats: response_token_stats,
    forward.response_states: response_states,
    reward.sequence_scores: sequence_scores,
}
