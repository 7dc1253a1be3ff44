"""The rollout container and its generation step.

A rollout holds one PPO step's experience. Shapes: ``B`` prompts, ``P`` prompt tokens (left-padded),
``T`` response tokens (right-padded after the first EOS).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from rlhfkit.data.collate import pad


@dataclass
class Rollout:
    query_ids: torch.Tensor       # [B, P] prompt tokens, left-padded
    query_mask: torch.Tensor      # [B, P] 1 on real prompt tokens
    response_ids: torch.Tensor    # [B, T] sampled tokens, pad after the first EOS
    response_mask: torch.Tensor   # [B, T] 1 on real response tokens (EOS included)
    scores: torch.Tensor          # [B]    reward-model score used in the reward (normalised, clipped)
    raw_scores: torch.Tensor      # [B]    reward-model score as the model gives it
    logprobs: torch.Tensor        # [B, T] log pi_old(a_t | s_t), the policy that sampled
    ref_logprobs: torch.Tensor    # [B, T] log pi_ref(a_t | s_t)
    values: torch.Tensor          # [B, T] V_old(s_t)
    rewards: torch.Tensor         # [B, T] -beta*KL_t, plus the score at the last real token
    advantages: torch.Tensor      # [B, T]
    returns: torch.Tensor         # [B, T] targets of the value function

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)  # [B, P + T]

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.response_mask], dim=1)  # [B, P + T]

    @property
    def n_response(self) -> int:
        return self.response_ids.shape[1]

    def select(self, index: torch.Tensor) -> "Rollout":
        """The rows ``index`` of every field (a minibatch)."""
        return replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self)})


def left_pad_prompts(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = pad(prompts, pad_id, side="left").to(device)
    mask = pad([[1] * len(p) for p in prompts], 0, side="left").to(device)
    return ids, mask


def truncate_after_eos(response_ids: torch.Tensor, eos_id: int | None, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``[B, T]`` with 1 up to and including the first EOS; tokens after it become padding."""
    if eos_id is None:
        mask = torch.ones_like(response_ids)
    else:
        is_eos = response_ids == eos_id
        after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0  # strictly after the first EOS
        mask = (~after_eos).long()
    return torch.where(mask.bool(), response_ids, torch.full_like(response_ids, pad_id)), mask


@torch.no_grad()
def generate(model, query_ids, query_mask, generation, eos_id: int | None, pad_id: int):
    """Sample responses with the KV cache; returns ``(response_ids [B, T], response_mask [B, T])``."""
    kwargs = dict(do_sample=True, temperature=generation.temperature, max_new_tokens=generation.max_new_tokens,
                  top_k=generation.top_k or None, top_p=generation.top_p, use_cache=True,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    out = model.generate(input_ids=query_ids, attention_mask=query_mask, **kwargs)
    response = out[:, query_ids.shape[1]:]
    return truncate_after_eos(response, eos_id, pad_id)
