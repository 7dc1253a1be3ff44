"""Forward passes shared by the trainers: per-token log-probs of response tokens, sequence sums.

Two layouts:
- a ``SequenceBatch`` is right-padded ``[B, L]`` prompt + response rows; outputs are aligned with the
  *predicted* tokens, i.e. position ``t`` of the output is about token ``t + 1`` of the input (``[B, L-1]``);
- online RL lays rows out as ``[left-padded prompt (P) | right-padded response (T)]``, position ids counted
  from the attention mask so left padding changes nothing; outputs are ``[B, T]`` over response tokens.

The functions marked ``@replaceable`` are the plain PyTorch passes; a faster implementation computing the same
numbers may stand in for them (``rlhfkit.models.fastpath``).
"""

from __future__ import annotations

import torch

from rlhfkit.data.collate import SequenceBatch
from rlhfkit.models.fastpath import replaceable
from rlhfkit.ops import entropy_from_logits, logprobs_from_logits


@replaceable
def logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``rlhfkit.ops.logprobs_from_logits``: ``[..., V]``, ``[...]`` -> ``[...]``."""
    return logprobs_from_logits(logits, labels)


@replaceable
def entropy(logits: torch.Tensor) -> torch.Tensor:
    """``rlhfkit.ops.entropy_from_logits``: ``[..., V]`` -> ``[...]``."""
    return entropy_from_logits(logits)


@replaceable
def next_token_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L-1, V]`` logits predicting tokens 1..L-1 of each (right-padded) row."""
    return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]


def token_logprobs(model, batch: SequenceBatch, temperature: float = 1.0, with_entropy: bool = False):
    """Log-probs ``[B, L-1]`` of each next token, its mask ``[B, L-1]`` (1 on response tokens), and
    optionally the entropy ``[B, L-1]`` of the next-token distribution."""
    logits = next_token_logits(model, batch.input_ids, batch.attention_mask).float()
    if temperature != 1.0:
        logits = logits / temperature
    out = logprobs(logits, batch.input_ids[:, 1:])
    mask = batch.response_mask[:, 1:].to(out.dtype)
    return out, mask, entropy(logits) if with_entropy else None


@replaceable
def labelled_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    response_mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Log-probs ``[N]`` of the next tokens at the ``N`` positions where ``mask [B, L-1]`` is true (row-major order)
    of right-padded ``[B, L]`` rows, taken without building the ``[B, L-1, V]`` logits; None where that is not
    done (always, in the plain pass): the caller then takes them from ``next_token_logits``. ``response_mask``
    ``[B, L]``: the rows' response tokens (``mask`` their labels), for rows that share their prompt tokens."""
    return None


def sequence_logprobs(model, batch: SequenceBatch) -> torch.Tensor:
    """``[B]`` sum of log-probs over each row's response tokens (DPO's log pi(y|x))."""
    mask = batch.response_mask[:, 1:].bool()
    labelled = labelled_logprobs(model, batch.input_ids, batch.attention_mask, mask, response_mask=batch.response_mask)
    if labelled is not None:
        rows = mask.nonzero()[:, 0]
        return torch.zeros(mask.shape[0], dtype=labelled.dtype, device=labelled.device).index_add(0, rows, labelled)
    out, mask, _ = token_logprobs(model, batch)
    return (out * mask).sum(dim=1)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` positions counted over real tokens (0 for left padding), as generation uses them."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def response_logits(model, input_ids, attention_mask, n_response: int, hidden: bool = False):
    """Logits ``[B, T, V]`` predicting the T response tokens (and the last hidden states ``[B, T, H]``)."""
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


@replaceable
def response_states(backbone, input_ids, attention_mask, n_response: int) -> torch.Tensor:
    """A transformer stack's last hidden states ``[B, T, H]`` at the positions that predict the T response
    tokens of ``[left-padded prompt | response]`` rows (a value model's backbone, read at every position)."""
    out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
    return out.last_hidden_state[:, -(n_response + 1) : -1]


@replaceable
def response_token_stats(
    model,
    input_ids,
    attention_mask,
    n_response: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    hidden: bool = False,
):
    """Log-probs of the T response tokens of ``[left-padded prompt | response]`` rows, their entropies (or None)
    and the last hidden states there (or None), ``[B, T]``, ``[B, T]``, ``[B, T, H]``."""
    labels = input_ids[:, -n_response:]
    logits, states = response_logits(model, input_ids, attention_mask, n_response, hidden=hidden)
    logits = logits.float()
    if temperature != 1.0:  # at 1 no second [B, T, V] tensor
        logits = logits / temperature
    return logprobs(logits, labels), entropy(logits) if with_entropy else None, states


@torch.no_grad()
def response_logprobs(model, input_ids, attention_mask, n_response: int, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` log-probs of the T response tokens of ``[left-padded prompt | response]`` rows under
    ``model`` (no gradient): the frozen reference's, or the policy's when measuring KL after training."""
    return response_token_stats(model, input_ids, attention_mask, n_response, temperature)[0]
