"""Step 1 of the online loop (sampling) and the containers a step passes along: the prompts (``PromptBatch``),
the sampled tokens (``Completions``), the rollout (``Rollout``), steps 1-6's result (``Experience``) and the
step's (``StepResult``).

A rollout holds one step's experience. Shapes: ``B`` completions (G per prompt; ``group_ids`` names each row's
prompt group, which the group advantages of steps 5-6 read rather than the rows' order), ``P`` prompt tokens
(left-padded), ``T`` response tokens (right-padded after the first EOS).

A multi-turn rollout's "response" is the whole conversation after the first prompt: the policy's replies with
the tool and environment messages spliced between them. ``response_mask`` covers all of it (the forward passes
attend to every token); ``action_mask`` only the tokens the policy sampled, which are the ones trained. In a
single-turn rollout the two are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from rlhfkit.data.collate import pad_with_mask
from rlhfkit.models.sampling import ended_with_stop, sample_responses, stop_token_ids
from rlhfkit.multiturn.rollout import conversation_metrics
from rlhfkit.trainers.online.policy import ActorCriticOutput
from rlhfkit.trainers.online.rewards import RewardBatch
from rlhfkit.training.distributed import gather_rows


class PromptBatch:
    """One step's prompts, each repeated G times (``--num-generations``) so a group's rows are contiguous.

    prompts, prompt_ids: ``[B]`` prompt (text or messages) and its token ids; rows: the 0-based data row of
    each; columns: the rows' other fields as lists aligned with ``prompts``; group_ids: ``[B]`` the group of
    each row (rows ``[k*G, (k+1)*G)`` form group ``first_group + k``; with several processes the groups are
    numbered over the whole step), which becomes ``Rollout.group_ids``."""

    def __init__(
        self, examples: list, prompt_ids: list[list[int]], index: list[int], group_size: int, first_group: int = 0
    ):
        self.rows = [i for i in index for _ in range(group_size)]
        self.prompts = [examples[i].prompt for i in self.rows]
        self.prompt_ids = [prompt_ids[i] for i in self.rows]
        names = list(dict.fromkeys(k for i in index for k in examples[i].extra))
        self.columns = {name: [examples[i].extra.get(name) for i in self.rows] for name in names}
        self.group_ids = [first_group + k for k in range(len(index)) for _ in range(group_size)]


@dataclass
class Completions:
    """Step 1's tokens: what the policy sampled for each prompt (shapes as ``Rollout``'s)."""

    query_ids: torch.Tensor  # [B, P] prompt tokens, left-padded
    query_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T] right-padded after the first EOS
    response_mask: torch.Tensor  # [B, T] 1 on real response tokens (EOS included)
    action_mask: torch.Tensor  # [B, T] the policy's tokens (single-turn: the response mask)
    turn_rewards: torch.Tensor  # [B, T] an environment's weighted per-turn rewards (single-turn: 0)
    finished: list[bool]  # [B] ended with a stop token (not cut off)
    engine_logprobs: torch.Tensor | None = None  # [B, T] the sampling engine's log-probs (--use-vllm); else None

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)  # [B, P + T]

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.response_mask], dim=1)  # [B, P + T]


@dataclass
class Sample:
    """Step 1's result: the tokens, what the rewards read of them, and (multi-turn) the conversations."""

    completions: Completions
    reward_batch: RewardBatch
    messages: list | None = None  # each row's whole conversation (multi-turn rollouts)
    metrics: dict[str, float] = field(default_factory=dict)  # the conversations' turns, tool calls, ...


@dataclass
class Rollout:
    query_ids: torch.Tensor  # [B, P] prompt tokens, left-padded
    query_mask: torch.Tensor  # [B, P] 1 on real prompt tokens
    response_ids: torch.Tensor  # [B, T] sampled tokens, pad after the first EOS
    response_mask: torch.Tensor  # [B, T] 1 on real response tokens (EOS included)
    action_mask: torch.Tensor  # [B, T] 1 on the tokens the policy sampled (multi-turn: not tools' or env's)
    loss_mask: torch.Tensor  # [B, T] action_mask less the rows left out of the update
    group_ids: torch.Tensor  # [B]    LongTensor: the prompt group of each row, numbered over the whole step
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
    engine_logprobs: torch.Tensor | None = None  # [B, T] log pi_engine(a_t | s_t) (--use-vllm); else None

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
def sample(
    policy,
    tokenizer,
    batch: PromptBatch,
    generation,
    device,
    multiturn=None,
    env_weight: float = 1.0,
    engine=None,
) -> Sample:
    """Step 1: one reply per prompt, or with ``multiturn`` (``rlhfkit.multiturn.rollout.MultiTurn``) one
    conversation per prompt, the tools and environment answering between the replies; then the last reply is
    the completion and the conversation before it the prompt. ``engine``: a
    ``rlhfkit.models.vllm_engine.VLLMEngine`` that samples instead of rlhfkit's own sampler (--use-vllm); its
    timings join the sample's metrics."""
    if multiturn is None:
        completions = generate(policy, tokenizer, batch.prompt_ids, generation, device, engine)
        response_ids, response_mask = completions.response_ids, completions.response_mask
        texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        ids = [row[: int(n)] for row, n in zip(response_ids.tolist(), response_mask.sum(dim=1).tolist())]
        reward_batch = RewardBatch(batch.prompts, texts, ids, completions.finished, batch.columns, batch.rows)
        return Sample(completions, reward_batch, metrics=engine.take_metrics() if engine is not None else {})
    convs = multiturn.rollout(policy, batch.prompts, batch.rows, batch.columns, generation, device, engine)
    reward_batch = RewardBatch(
        [c.messages[:-1] for c in convs],
        [c.reply for c in convs],
        [c.reply_ids for c in convs],
        [c.finished for c in convs],
        batch.columns,
        batch.rows,
        messages=[c.messages for c in convs],
        env_rewards=[c.env_reward for c in convs],
        openings=[c.opening for c in convs],
        conversation_ids=[c.ids for c in convs],
    )
    completions = conversation_tensors(convs, tokenizer.pad_token_id, env_weight, device)
    metrics = {**(engine.take_metrics() if engine is not None else {}), **conversation_metrics(convs)}
    return Sample(completions, reward_batch, [c.messages for c in convs], metrics)


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], generation, device, engine=None) -> Completions:
    """Sample one response per prompt with the KV cache (``rlhfkit.models.sampling``), or with ``engine`` (a
    ``rlhfkit.models.vllm_engine.VLLMEngine``) when given: then its log-prob of each sampled token comes too.

    A response ends at its first EOS (kept, masked 1), padding after it is masked 0; ``finished[i]`` is False
    for a response cut off at max_new_tokens. The action mask is the response mask; no turn rewards.
    """
    engine_logprobs = None
    if engine is None:
        responses = sample_responses(model, tokenizer, prompt_ids, generation, len(prompt_ids), device)
    else:
        responses = engine.sample(model, prompt_ids, generation)
        engine_logprobs = padded_logprobs(engine.last_logprobs, device)
    query_ids, query_mask = pad_with_mask(prompt_ids, tokenizer.pad_token_id, "left", device)
    response_ids, response_mask = pad_with_mask(responses, tokenizer.pad_token_id, "right", device)
    finished = ended_with_stop(responses, stop_token_ids(model, tokenizer))
    turn_rewards = torch.zeros_like(response_mask, dtype=torch.float)
    return Completions(
        query_ids, query_mask, response_ids, response_mask, response_mask, turn_rewards, finished, engine_logprobs
    )


def padded_logprobs(rows: list[list[float]], device) -> torch.Tensor:
    """``[B, T]`` float32 per-token log-probs, right-padded with 0 (the layout of ``response_ids``)."""
    out = torch.zeros(len(rows), max((len(r) for r in rows), default=0), dtype=torch.float32)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out.to(device)


def conversation_tensors(convs, pad_id: int, env_weight: float, device) -> Completions:
    """The tokens of a multi-turn rollout (``rlhfkit.multiturn.rollout.Conversation`` rows): prompt and
    response ids with their masks as ``generate`` makes them, the ``action_mask`` of the policy's tokens,
    and ``turn_rewards`` (the environment's rewards, times ``env_weight``, at their turns' last tokens)."""
    query_ids, query_mask = pad_with_mask([c.prompt_ids for c in convs], pad_id, "left", device)
    response_ids, response_mask = pad_with_mask([c.ids for c in convs], pad_id, "right", device)
    action_mask, _ = pad_with_mask([c.actions for c in convs], 0, "right", device)
    turn_rewards = torch.zeros(response_ids.shape, dtype=torch.float32, device=device)
    for b, c in enumerate(convs):
        for position, reward in c.turn_rewards:
            turn_rewards[b, position] += env_weight * reward
    action_mask = action_mask.to(response_mask.dtype)
    finished = [c.finished for c in convs]
    engine_logprobs = None
    if convs and convs[0].logprobs is not None:  # sampled by an engine: its log-probs, 0 on the spliced tokens
        engine_logprobs = padded_logprobs([c.logprobs for c in convs], device)
    return Completions(
        query_ids, query_mask, response_ids, response_mask, action_mask, turn_rewards, finished, engine_logprobs
    )


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


@dataclass
class Experience:
    """Steps 1-6 of one step, what the update (step 7) and the log (step 8) read."""

    rollout: Rollout  # this process's rows
    everyone: Rollout  # every process's rows (``gather_rollout``), as steps 5-6 saw them
    first_pass: ActorCriticOutput | None  # epoch 1's forward, run with gradients in the rollout; else None
    metrics: dict[str, float]  # timings, reward components, zero-std groups, conversations

    @property
    def finite(self) -> bool:
        """Whether every reward and advantage is a number (else the update is skipped)."""
        return bool(torch.isfinite(self.everyone.rewards).all() and torch.isfinite(self.everyone.advantages).all())


@dataclass
class StepResult:
    """What ``OnlineTrainer.step`` returns: the step's metrics, and the whole batch's rollout (every process's
    rows); both empty when a non-finite reward or loss made the step skip its update."""

    metrics: dict[str, float] = field(default_factory=dict)
    rollout: Rollout | None = None
