"""The rollout container and its generation step.

A rollout holds one step's experience. Shapes: ``B`` completions (G per prompt, a group's rows contiguous),
``P`` prompt tokens (left-padded), ``T`` response tokens (right-padded after the first EOS).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from rlhfkit.data.collate import pad_with_mask
from rlhfkit.models.sampling import ended_with_stop, sample_responses, stop_token_ids
from rlhfkit.training.distributed import gather_rows


@dataclass
class Rollout:
    query_ids: torch.Tensor  # [B, P] prompt tokens, left-padded
    query_mask: torch.Tensor  # [B, P] 1 on real prompt tokens
    response_ids: torch.Tensor  # [B, T] sampled tokens, pad after the first EOS
    response_mask: torch.Tensor  # [B, T] 1 on real response tokens (EOS included)
    loss_mask: torch.Tensor  # [B, T] response_mask less the rows left out of the update
    group_ids: torch.Tensor  # [B]    the prompt group of each row
    scores: torch.Tensor  # [B]    reward used in the update (weighted, normalised, penalised, clipped)
    raw_scores: torch.Tensor  # [B]    weighted sum of the rewards as they come (NaN where none applies)
    valid: torch.Tensor  # [B]    bool: some reward applies to the row
    finished: torch.Tensor  # [B]    bool: the completion ended with a stop token (not cut off)
    logprobs: torch.Tensor  # [B, T] log pi_old(a_t | s_t), the policy that sampled
    ref_logprobs: torch.Tensor | None  # [B, T] log pi_ref(a_t | s_t); None without a reference
    values: torch.Tensor | None  # [B, T] V_old(s_t); None without a critic
    rewards: torch.Tensor  # [B, T] the reward at the last real token (minus beta*KL_t when in the reward)
    advantages: torch.Tensor  # [B, T]
    returns: torch.Tensor  # [B, T] targets of the value function (critic-free: the return, for logging)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)  # [B, P + T]

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.response_mask], dim=1)  # [B, P + T]

    @property
    def n_response(self) -> int:
        return self.response_ids.shape[1]

    def select(self, index: torch.Tensor) -> Rollout:
        """The rows ``index`` of every field (a minibatch)."""
        chosen = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v[index] for k, v in chosen.items() if v is not None})


QUERY_FIELDS = ("query_ids", "query_mask")  # left-padded: padded at the front when gathered


def gather_rollout(accelerator, r: Rollout, pad_id: int) -> Rollout:
    """Every rank's rollout, rows in rank order, on every rank (``r`` itself with one process). Prompt columns
    are padded at the front and response columns at the back to the longest rank's; ``NaN`` raw scores
    (no reward applies) stay ``NaN``."""
    if accelerator.num_processes == 1:
        return r
    out = {}
    for f in fields(r):
        value = getattr(r, f.name)
        pad = pad_id if f.name in ("query_ids", "response_ids") else 0
        if value is not None and value.dtype == torch.bool:  # collectives move numbers
            out[f.name] = gather_rows(accelerator, value.to(torch.uint8)).bool()
        else:
            out[f.name] = gather_rows(accelerator, value, pad, pad_first=f.name in QUERY_FIELDS)
    return Rollout(**out)


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], generation, device):
    """Sample one response per prompt with the KV cache (``rlhfkit.models.sampling``).

    Returns ``(query_ids [B, P] left-padded, query_mask, response_ids [B, T] right-padded, response_mask,
    finished)``; a response ends at its first EOS (kept, masked 1), padding after it is masked 0;
    ``finished[i]`` is False for a response cut off at max_new_tokens.
    """
    responses = sample_responses(model, tokenizer, prompt_ids, generation, len(prompt_ids), device)
    query_ids, query_mask = pad_with_mask(prompt_ids, tokenizer.pad_token_id, "left", device)
    response_ids, response_mask = pad_with_mask(responses, tokenizer.pad_token_id, "right", device)
    finished = ended_with_stop(responses, stop_token_ids(model, tokenizer))
    return query_ids, query_mask, response_ids, response_mask, finished
