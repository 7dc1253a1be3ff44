"""The trainable side of PPO: policy + value function, and one forward pass that yields both.

Value function options:
- a scalar head on the policy's last hidden state (default; with LoRA this is the one-backbone mode:
  policy, value and — adapters off — reference all share one copy of the weights);
- a separate value model initialised from the reward model (as InstructGPT did): its backbone and
  ``score`` head applied at every position.

Rows are ``[left-padded prompt (P) | right-padded response (T)]`` (see ``rlhfkit.models.forward``); outputs
are ``[B, T]`` over response tokens.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import torch
from torch import nn

from rlhfkit.errors import UserError
from rlhfkit.models.forward import response_states, response_token_stats


class Networks(Enum):
    """Which networks of an actor-critic with a separate value model a forward pass runs (``ActorCritic``)."""

    ALL = "all"
    """The policy and the value function."""
    POLICY = "policy"
    """The policy alone (the values come out None)."""
    VALUE = "value"
    """The separate value model alone (the log-probs and entropies come out None)."""


class ActorCriticOutput(NamedTuple):
    """One forward pass's outputs over the response tokens, each ``[B, T]`` or None where not computed."""

    logprobs: torch.Tensor | None
    """log pi(a_t | s_t) at the given temperature."""
    values: torch.Tensor | None
    """V(s_t); None without a critic."""
    entropy: torch.Tensor | None
    """The policy's entropy at each position; None unless asked for."""


class ValueHead(nn.Module):
    """``V(s_t) = w·h_t + b`` on a backbone's last hidden state; starts at 0."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


class SeparateValueModel(nn.Module):
    """A reward-model-shaped network (backbone + ``score`` linear head) read at every position."""

    def __init__(self, seq_cls_model):
        super().__init__()
        prefix = getattr(seq_cls_model, "base_model_prefix", "")
        if not hasattr(seq_cls_model, prefix) or not isinstance(getattr(seq_cls_model, "score", None), nn.Linear):
            raise UserError(
                "the value model must be a decoder reward model with a linear 'score' head (e.g. made by `rlhfkit rm`)"
            )
        self.backbone = getattr(seq_cls_model, prefix)
        self.score = seq_cls_model.score

    def forward(self, input_ids, attention_mask, n_response: int) -> torch.Tensor:
        return self.score(response_states(self.backbone, input_ids, attention_mask, n_response)).squeeze(-1)


class ActorCritic(nn.Module):
    """Policy (a causal LM, possibly with LoRA) + value function, trained together by one optimizer.

    ``critic=False`` (the critic-free algorithms) builds no value function at all: ``forward`` then returns
    None for the values."""

    def __init__(self, policy, value_model: SeparateValueModel | None = None, critic: bool = True):
        super().__init__()
        self.policy = policy
        self.value_model = value_model if critic else None
        self.value_head = ValueHead(policy.config.hidden_size) if critic and value_model is None else None

    @property
    def has_critic(self) -> bool:
        return self.value_head is not None or self.value_model is not None

    def forward(
        self,
        input_ids,
        attention_mask,
        n_response: int,
        temperature: float = 1.0,
        with_entropy: bool = False,
        networks: Networks = Networks.ALL,
    ) -> ActorCriticOutput:
        """Log-probs of the given response tokens, values (None without a critic) and (optionally) entropies,
        each ``[B, T]``. ``networks``: with a separate value model, ``Networks.POLICY`` or ``Networks.VALUE`` runs
        only that one (the other's outputs are None)."""
        if networks is Networks.VALUE:
            return ActorCriticOutput(None, self.value_model(input_ids, attention_mask, n_response).float(), None)
        logprobs, entropy, hidden = response_token_stats(
            self.policy,
            input_ids,
            attention_mask,
            n_response,
            temperature,
            with_entropy,
            hidden=self.value_head is not None,
        )
        if self.value_head is not None:
            values = self.value_head(hidden).float()
        elif self.value_model is not None and networks is Networks.ALL:
            values = self.value_model(input_ids, attention_mask, n_response).float()
        else:
            values = None
        return ActorCriticOutput(logprobs, values, entropy)
