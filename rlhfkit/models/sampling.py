"""Sample responses from a causal LM: one function used by `rlhfkit generate`, PPO rollouts and evaluation.

Prompts are LEFT-padded for generation (every row's last prompt token sits in the last column, so
the first sampled token of every row is at the same position); positions come from the attention
mask, so padding never shifts a row. Sampling uses exactly the given temperature / top-k / top-p:
any sampling defaults in the model's ``generation_config.json`` (a repetition penalty, a default
top-k of 50, ...) are ignored, so log-probs computed later at ``temperature`` match the sampler.
"""

from __future__ import annotations

import contextlib

import torch

from rlhfkit.data.collate import pad


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS of the tokenizer plus any end-of-turn ids the model's generation config lists."""
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    configured = getattr(getattr(_base(model), "generation_config", None), "eos_token_id", None)
    for token in [configured] if isinstance(configured, int) else (configured or []):
        if token not in ids:
            ids.append(int(token))
    return ids


def _base(model):
    """The Hugging Face model inside DDP / PEFT wrappers (the one whose generation_config is read)."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def _clean_generation_config(model, tokenizer, stops: list[int]):
    """Temporarily replace the model's generation defaults with neutral ones."""
    from transformers import GenerationConfig

    base = _base(model)
    saved = base.generation_config
    base.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stops, pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=None,
    )
    try:
        yield
    finally:
        base.generation_config = saved


def cut_at_stop(ids: list[int], stops: list[int]) -> list[int]:
    """``ids`` up to and including the first stop token (all of ``ids`` when none occurs)."""
    for i, token in enumerate(ids):
        if token in stops:
            return ids[: i + 1]
    return ids


@torch.no_grad()
def sample_responses(model, tokenizer, prompts_ids: list[list[int]], generation_args, batch_size: int,
                     device, progress=None) -> list[list[int]]:
    """Sample one response per prompt; returns response token ids, each cut after its first EOS (kept).

    EOS here is any of ``stop_token_ids``: the tokenizer's EOS and end-of-turn ids listed in the model's
    generation config. A response that never stops has ``max_new_tokens`` tokens and no EOS.

    prompts_ids: token ids of each prompt (already truncated to the longest allowed prompt).
    generation_args: a ``GenerationArgs`` (max_new_tokens, temperature, top_k, top_p).
    progress: optional callable ``progress(n_rows_done_in_this_batch)``, e.g. a tqdm bar's ``update``.
    The caller seeds the RNG; sampling is then deterministic for a given batch size on one device.
    """
    if any(len(p) == 0 for p in prompts_ids):
        raise ValueError("sample_responses: every prompt needs at least one token")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = stop_token_ids(model, tokenizer)
    model = getattr(model, "module", model)  # DDP wraps the model; generate lives on the inner one
    was_training = model.training
    model.eval()
    responses: list[list[int]] = []
    try:
        with _clean_generation_config(model, tokenizer, stops):
            for start in range(0, len(prompts_ids), batch_size):
                chunk = prompts_ids[start: start + batch_size]
                input_ids = pad(chunk, pad_id, side="left").to(device)  # [B, P]
                attention_mask = pad([[1] * len(p) for p in chunk], 0, side="left").to(device)  # [B, P]
                out = model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
                    temperature=generation_args.temperature, top_k=generation_args.top_k,
                    top_p=generation_args.top_p, max_new_tokens=generation_args.max_new_tokens,
                    min_new_tokens=0, pad_token_id=pad_id, eos_token_id=stops, use_cache=True,
                )  # [B, P + new]
                for row in out[:, input_ids.shape[1]:].tolist():
                    responses.append(cut_at_stop(row, stops))
                if progress is not None:
                    progress(len(chunk))
    finally:
        model.train(was_training)
    return responses


def decode(tokenizer, ids: list[int]) -> str:
    """Response text without special tokens (EOS, padding)."""
    return tokenizer.decode(ids, skip_special_tokens=True)
