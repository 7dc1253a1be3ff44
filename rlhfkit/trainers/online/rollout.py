"""The rollout container and its generation step.

A rollout holds one step's experience. Shapes: ``B`` completions (G per prompt, a group's rows contiguous),
``P`` prompt tokens (left-padded), ``T`` response tokens (right-padded after the first EOS).

A multi-turn rollout's "response" is the whole conversation after the first prompt: the policy's replies with
the tool and environment messages spliced between them. ``response_mask`` covers all of it (the forward passes
attend to every token); ``action_mask`` only the tokens the policy sampled, which are the ones trained. In a
single-turn rollout the two are the same.
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
    action_mask: torch.Tensor  # [B, T] 1 on the tokens the policy sampled (multi-turn: not tools' or env's)
    loss_mask: torch.Tensor  # [B, T] action_mask less the rows left out of the update
    group_ids: torch.Tensor  # [B]    the prompt group of each row
    scores: torch.Tensor  # [B]    reward used in the update (weighted, normalised, penalised, clipped)
    raw_scores: torch.Tensor  # [B]    weighted sum of the rewards as they come (NaN where none applies)
    valid: torch.Tensor  # [B]    bool: some reward applies to the row
    finished: torch.Tensor  # [B]    bool: the completion ended with a stop token (not cut off)
    logprobs: torch.Tensor  # [B, T] log pi_old(a_t | s_t), the policy that sampled
    ref_logprobs: torch.Tensor | None  # [B, T] log pi_ref(a_t | s_t); None without a reference
    values: torch.Tensor | None  # [B, T] V_old(s_t); None without a critic
    turn_rewards: torch.Tensor  # [B, T] an environment's weighted per-turn rewards at their turns' last tokens
    rewards: torch.Tensor  # [B, T] the reward at the last real token (minus beta*KL_t when in the reward)
    advantages: torch.Tensor  # [B, T]
    returns: torch.Tensor  # [B, T] targets of the value function (critic-free: the return, for logging)
    engine_logprobs: torch.Tensor | None = None  # [B, T] the sampling engine's log-probs (--use-vllm); else None

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
def generate(model, tokenizer, prompt_ids: list[list[int]], generation, device, engine=None):
    """Sample one response per prompt with the KV cache (``rlhfkit.models.sampling``), or with ``engine`` (a
    ``rlhfkit.models.vllm_engine.VLLMEngine``) when given.

    Returns ``(query_ids [B, P] left-padded, query_mask, response_ids [B, T] right-padded, response_mask,
    finished)``; a response ends at its first EOS (kept, masked 1), padding after it is masked 0;
    ``finished[i]`` is False for a response cut off at max_new_tokens.
    """
    if engine is None:
        responses = sample_responses(model, tokenizer, prompt_ids, generation, len(prompt_ids), device)
    else:
        responses = engine.sample(model, prompt_ids, generation)
    query_ids, query_mask = pad_with_mask(prompt_ids, tokenizer.pad_token_id, "left", device)
    response_ids, response_mask = pad_with_mask(responses, tokenizer.pad_token_id, "right", device)
    finished = ended_with_stop(responses, stop_token_ids(model, tokenizer))
    return query_ids, query_mask, response_ids, response_mask, finished


def padded_logprobs(rows: list[list[float]], device) -> torch.Tensor:
    """``[B, T]`` float32 per-token log-probs, right-padded with 0 (the layout of ``response_ids``)."""
    out = torch.zeros(len(rows), max((len(r) for r in rows), default=0), dtype=torch.float32)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out.to(device)


def conversation_tensors(convs, pad_id: int, env_weight: float, device) -> dict:
    """The tensors of a multi-turn rollout (``rlhfkit.multiturn.rollout.Conversation`` rows): prompt and
    response ids with their masks as ``generate`` returns them, the ``action_mask`` of the policy's tokens,
    and ``turn_rewards`` (the environment's rewards, times ``env_weight``, at their turns' last tokens)."""
    query_ids, query_mask = pad_with_mask([c.prompt_ids for c in convs], pad_id, "left", device)
    response_ids, response_mask = pad_with_mask([c.ids for c in convs], pad_id, "right", device)
    action_mask, _ = pad_with_mask([c.actions for c in convs], 0, "right", device)
    turn_rewards = torch.zeros(response_ids.shape, dtype=torch.float32, device=device)
    for b, c in enumerate(convs):
        for position, reward in c.turn_rewards:
            turn_rewards[b, position] += env_weight * reward
    return {
        "query_ids": query_ids,
        "query_mask": query_mask,
        "response_ids": response_ids,
        "response_mask": response_mask,
        "action_mask": action_mask.to(response_mask.dtype),
        "turn_rewards": turn_rewards,
    }


def action_order(mask: torch.Tensor) -> torch.Tensor | None:
    """``[B, T]`` a permutation of each row's columns that puts its action tokens first, in order; None when
    they already are (no tool or environment tokens between them). The advantage estimators then run on
    ``x.gather(1, order)`` as if the context tokens were not there (GAE bootstraps from the next *policy*
    token's value, across a tool's answer), and their output goes back with ``scatter``."""
    ones = mask.sum(dim=1, keepdim=True)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    if bool(((positions < ones) == mask.bool()).all()):
        return None
    return torch.sort((mask == 0).to(torch.int8), dim=1, stable=True).indices
