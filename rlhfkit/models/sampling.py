"""Sample responses from a causal LM: one function used by `rlhfkit generate`, PPO rollouts and evaluation.

Prompts are LEFT-padded for generation (every row's last prompt token sits in the last column, so
the first sampled token of every row is at the same position); positions come from the attention
mask, so padding never shifts a row. Sampling uses exactly the given temperature / top-k / top-p:
any sampling defaults in the model's ``generation_config.json`` (a repetition penalty, a default
top-k of 50, ...) are ignored, so log-probs computed later at ``temperature`` match the sampler.

Decoding is our own KV-cache loop rather than ``model.generate``: per step it is one forward of one
token, the temperature / top-k / top-p filter (Hugging Face's semantics, in that order) and one
inverse-CDF draw. On small models that is markedly cheaper than ``generate``'s per-step machinery
(logits processors, stopping criteria, input preparation) plus ``torch.multinomial``. Models the
loop cannot drive (encoder-decoders) fall back to ``generate``.
"""

from __future__ import annotations

import inspect

import torch

from rlhfkit.data.collate import pad_with_mask
from rlhfkit.models.fastpath import replaceable
from rlhfkit.models.unwrap import base_model, without_ddp
from rlhfkit.ops import logprobs_from_logits


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS of the tokenizer plus any end-of-turn ids the model's generation config lists."""
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    configured = getattr(getattr(base_model(model), "generation_config", None), "eos_token_id", None)
    for token in [configured] if isinstance(configured, int) else (configured or []):
        if token not in ids:
            ids.append(int(token))
    return ids


def ended_with_stop(responses: list[list[int]], stops: list[int]) -> list[bool]:
    """Per response (as ``sample_responses`` returns them), whether it ended with a stop token; False
    means it was cut off at ``max_new_tokens``."""
    return [bool(r) and r[-1] in stops for r in responses]


def cut_at_stop(ids: list[int], stops: list[int]) -> list[int]:
    """``ids`` up to and including the first stop token (all of ``ids`` when none occurs)."""
    for i, token in enumerate(ids):
        if token in stops:
            return ids[: i + 1]
    return ids


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering; removed tokens get ``-inf``.

    logits: [B, V] float. Returns [B, V] ``logits / temperature`` with removed entries set to -inf.
    Same kept set as Hugging Face's ``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` ->
    ``TopPLogitsWarper`` (min_tokens_to_keep=1), including ties: top-k keeps every token at least as
    large as the k-th largest; top-p (Holtzman et al. 2020, "The Curious Case of Neural Text
    Degeneration") sorts ascending and removes the tokens whose cumulative probability is
    ``<= 1 - top_p``, always keeping the most likely one. ``top_k=0`` and ``top_p=1.0`` turn them off.
    """
    if top_k < 0 or not 0.0 <= top_p <= 1.0:
        raise ValueError(f"filter_logits: need top_k >= 0 and 0 <= top_p <= 1, got top_k={top_k}, top_p={top_p}")
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1)  # ascending, [B, V]
        remove = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p  # [B, V], in sorted order
        remove[:, -1] = False  # the most likely token always stays
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def sample_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """One token per row from ``softmax(logits)`` by inverse-CDF sampling; logits [B, V] -> ids [B].

    Exact categorical sampling: with ``cdf`` the running sum of the probabilities and ``u`` uniform on
    ``[0, cdf[-1])``, the first index whose ``cdf`` exceeds ``u`` is token i with probability
    ``p_i / sum(p)``. A token with probability 0 (``-inf`` logit) never is: its cdf equals its left
    neighbour's. Used instead of ``torch.multinomial``, whose CPU path (an ``exponential_`` draw per
    entry) is ~8x slower on a [16, 900] matrix. Draws B numbers from the global torch RNG (seeded by
    the caller), so results are reproducible for a given seed and batch size.
    """
    cdf = logits.softmax(-1).cumsum(-1)  # [B, V], non-decreasing
    total = cdf[:, -1:]  # [B, 1], ~1
    u = torch.rand(total.shape, device=cdf.device, dtype=cdf.dtype) * total
    # rand is < 1, so u < total already; the bound guards against a generator or rounding that reaches
    # total, where searchsorted would run off the end (onto a possibly zero-probability last token).
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)  # [B]


def _forward_accepts(model, name: str) -> bool:
    """Whether the (unwrapped) model's forward takes ``name`` as a named argument."""
    return name in inspect.signature(base_model(model).forward).parameters


def cache_keyword(model) -> str:
    """The name the model's forward takes its key / value cache by: ``cache`` from transformers 5.24 on,
    ``past_key_values`` before (5.24 still reads the old name, with a deprecation warning)."""
    return "cache" if _forward_accepts(model, "cache") else "past_key_values"


def output_cache(out):
    """The key / value cache of a model output (``cache`` from transformers 5.24 on, else ``past_key_values``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def distinct_prompts(prompts_ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts of a batch in first-seen order, and for each row the index of its prompt among them.

    GRPO / RLOO batches hold each prompt G times (a group's rows contiguous); the sampler runs each distinct
    prompt through the model once and lets its G rows continue from the same key / value cache.
    """
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(p), len(first)) for p in prompts_ids]
    distinct = [None] * len(first)
    for p, i in zip(prompts_ids, index):
        distinct[i] = p
    return distinct, index


@replaceable
def decode_step(model, prefill_cache, rows: torch.Tensor, capacity: int):
    """An object whose ``step(tokens [B, 1], positions [B, 1], mask [B, P + t + 1] bool)`` returns the next
    logits ``[B, V]`` of the rows continuing ``prefill_cache`` (``rows``: the prompt each row continues; at most
    ``capacity`` positions), standing in for the model's forward in the decode loop; None (always, in the plain
    code): the loop calls the model with its ``DynamicCache``."""
    return None


def _decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: torch.Tensor,
    generation_args,
    stops: list[int],
    pad_id: int,
    logps: list | None = None,
) -> torch.Tensor:
    """Sample up to ``max_new_tokens`` tokens after left-padded prompts, with a KV cache.

    input_ids, attention_mask: [U, P] left-padded distinct prompts; rows: [B] the prompt each sampled row
    continues. Returns [B, T] sampled ids with T <= max_new_tokens; after a row's first stop token it holds
    ``pad_id`` (cut off by the caller). The loop ends once every row has stopped. ``logps``: a list that gets
    the [B] log-probability of each step's token under ``softmax(logits / temperature)`` (the model's whole
    distribution, before top-k / top-p), as a forward pass over the sampled rows gives it up to float rounding.

    1. Prefill: the model's forward over the U prompts (``logits_to_keep=1`` skips the LM head on all but
       the last position); its last logits and key / value cache are then repeated to the B rows. Each row
       gets exactly the numbers a forward of its own prompt row gives, so sharing changes no sample.
    2. Decode: one new token per row and step, the model's forward with a ``DynamicCache`` (``model`` is called
       directly: a PEFT wrapper applies its adapters), or the step ``decode_step`` gives.
    """
    from transformers import DynamicCache

    g = generation_args
    batch, prompt_len = rows.shape[0], input_ids.shape[1]
    if g.max_new_tokens == 0:
        return input_ids.new_empty(batch, 0)
    shared = input_ids.shape[0] < batch
    keep_last = {"logits_to_keep": 1} if _forward_accepts(model, "logits_to_keep") else {}
    cache_arg = cache_keyword(model)
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)  # [U, P]; padding -> 0
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        **{cache_arg: DynamicCache(config=base_model(model).config)},
        **keep_last,
    )
    cache, logits = output_cache(out), out.logits[:, -1]  # logits [U, V]
    # The mask of every step is a view of this one: prompt columns, then a column per sampled token. Finished
    # rows go on being fed (their tokens are cut off later); their columns of ones are fine, as no kept token
    # ever attends to a token sampled after its row's stop.
    mask = attention_mask.new_ones(batch, prompt_len + g.max_new_tokens)  # [B, P + T]
    mask[:, :prompt_len] = attention_mask[rows] if shared else attention_mask
    positions = positions[rows, -1:] if shared else positions[:, -1:]  # [B, 1], the last prompt token's
    logits = logits[rows] if shared else logits
    lean = decode_step(model, cache, rows, prompt_len + g.max_new_tokens)
    if lean is not None:
        mask = mask.bool()
    elif shared:
        cache.batch_select_indices(rows)
    stop_ids = torch.tensor(stops, dtype=torch.long, device=input_ids.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)  # [B]
    tokens = []
    for t in range(g.max_new_tokens):
        # float32 like generate(): a half-precision softmax / CDF would bias the draw.
        raw = logits.float()
        logits = filter_logits(raw, g.temperature, g.top_k, g.top_p)  # [B, V]
        token = sample_from_logits(logits).masked_fill(finished, pad_id)  # [B]
        tokens.append(token)
        if logps is not None:
            scaled = raw / g.temperature if g.temperature != 1.0 else raw
            logps.append(logprobs_from_logits(scaled, token))  # the forward pass's formula, [B]
        finished |= torch.isin(token, stop_ids)
        if t + 1 == g.max_new_tokens or bool(finished.all()):
            break
        positions = positions + 1
        seen = mask[:, : prompt_len + t + 1]  # [B, P + t + 1]: the prompt, the sampled tokens, this one
        if lean is not None:
            logits = lean.step(token[:, None], positions, seen)
        else:
            out = model(
                input_ids=token[:, None],
                attention_mask=seen,
                position_ids=positions,
                use_cache=True,
                **{cache_arg: cache},
                **keep_last,
            )
            cache, logits = output_cache(out), out.logits[:, -1]
    return torch.stack(tokens, dim=1)


def _generate(model, input_ids, attention_mask, rows, generation_args, stops: list[int], pad_id: int) -> torch.Tensor:
    """Fallback for models ``_decode`` cannot drive (an encoder-decoder, a forward without a KV cache or
    position ids): ``model.generate`` with the model's own sampling defaults swapped out. [B, T] ids."""
    from transformers import GenerationConfig

    g, base = generation_args, base_model(model)
    input_ids, attention_mask = input_ids[rows], attention_mask[rows]  # [B, P]
    saved = base.generation_config
    # generate() fills every unset option from model.generation_config, so a neutral one is swapped in.
    base.generation_config = GenerationConfig(
        eos_token_id=stops,
        pad_token_id=pad_id,
        bos_token_id=saved.bos_token_id,
        decoder_start_token_id=saved.decoder_start_token_id,
    )
    try:
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=g.temperature,
            top_k=g.top_k,
            top_p=g.top_p,
            max_new_tokens=g.max_new_tokens,
            min_new_tokens=0,
            pad_token_id=pad_id,
            eos_token_id=stops,
            use_cache=True,
        )  # [B, P + T], or [B, 1 + T] decoder ids
    finally:
        base.generation_config = saved
    return out[:, 1:] if base.config.is_encoder_decoder else out[:, input_ids.shape[1] :]


def _loop_supported(model) -> bool:
    """Whether ``_decode`` can drive the model: a decoder-only forward with a KV cache and position ids."""
    return not base_model(model).config.is_encoder_decoder and all(
        _forward_accepts(model, name) for name in (cache_keyword(model), "position_ids", "attention_mask")
    )


@torch.no_grad()
def sample_responses(
    model,
    tokenizer,
    prompts_ids: list[list[int]],
    generation_args,
    batch_size: int,
    device,
    progress=None,
    share_prompts: bool = True,
    logprobs: list | None = None,
) -> list[list[int]]:
    """Sample one response per prompt; returns response token ids, each cut after its first EOS (kept).

    EOS here is any of ``stop_token_ids``: the tokenizer's EOS and end-of-turn ids listed in the model's
    generation config. A response that never stops has ``max_new_tokens`` tokens and no EOS.

    prompts_ids: token ids of each prompt (already truncated to the longest allowed prompt).
    generation_args: a ``GenerationArgs`` (max_new_tokens, temperature, top_k, top_p).
    progress: optional callable ``progress(n_rows_done_in_this_batch)``, e.g. a tqdm bar's ``update``.
    share_prompts: run each distinct prompt of a batch through the model once (``distinct_prompts``); the
    samples are the same either way.
    logprobs: a list that gets, per response, the log-probability of each of its tokens under the model at
    ``temperature`` (the logits each token was drawn from, before top-k / top-p), which spares a forward pass
    over the responses; left empty for a model the decode loop cannot drive (``_generate``).
    The caller seeds the RNG; sampling is then deterministic for a given batch size on one device.
    """
    if any(len(p) == 0 for p in prompts_ids):
        raise ValueError("sample_responses: every prompt needs at least one token")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = stop_token_ids(model, tokenizer)
    model = without_ddp(model)  # call the module inside a DDP wrapper
    decode_batch = _decode if _loop_supported(model) else _generate
    was_training = model.training
    model.eval()
    responses: list[list[int]] = []
    try:
        for start in range(0, len(prompts_ids), batch_size):
            chunk = prompts_ids[start : start + batch_size]
            distinct, rows = distinct_prompts(chunk) if share_prompts else (chunk, list(range(len(chunk))))
            input_ids, attention_mask = pad_with_mask(distinct, pad_id, "left", device)  # [U, P] each
            rows = torch.tensor(rows, dtype=torch.long, device=input_ids.device)  # [B]
            steps = [] if logprobs is not None and decode_batch is _decode else None
            extra = {"logps": steps} if steps is not None else {}
            new = decode_batch(model, input_ids, attention_mask, rows, generation_args, stops, pad_id, **extra)
            kept = [cut_at_stop(row, stops) for row in new.tolist()]  # [B, T] -> each up to its stop
            responses.extend(kept)
            if steps is not None:
                rows_logps = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in kept]  # [B, T]
                logprobs.extend(lp[: len(ids)] for lp, ids in zip(rows_logps, kept))
            if progress is not None:
                progress(len(chunk))
    finally:
        model.train(was_training)
    return responses


def decode(tokenizer, ids: list[int]) -> str:
    """Response text without special tokens (EOS, padding)."""
    return tokenizer.decode(ids, skip_special_tokens=True)
