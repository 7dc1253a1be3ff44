"""Token ids for prompts, responses and SFT examples, with truncation rules in one place.

Prompt and response are tokenized separately and concatenated, so the boundary between them is
exact (a BPE merge across it would blur which tokens are the response).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.data.schema import PreferenceExample, SFTExample, Text
from rlhfkit.data.templates import conversation_segments, has_chat_template, render_prompt, render_response

IGNORE_INDEX = -100


@dataclass
class Encoded:
    """A prompt and a response as token ids; the response ends with EOS unless truncated."""

    prompt_ids: list[int]
    response_ids: list[int]
    full_length: int = 0  # prompt + response tokens before any cut (0: not recorded)


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return tokenizer(text, add_special_tokens=special)["input_ids"]


def prompt_token_ids(tokenizer, prompt: Text) -> list[int]:
    """All of a prompt's ids, as rendered for the model."""
    # String prompts get the tokenizer's special tokens (e.g. BOS); chat templates write their own.
    return _ids(
        tokenizer, render_prompt(tokenizer, prompt), special=isinstance(prompt, str) or not has_chat_template(tokenizer)
    )


def encode_prompt(tokenizer, prompt: Text, max_prompt_length: int) -> list[int]:
    """Prompt ids, keeping the last ``max_prompt_length`` tokens (the end is what the response follows)."""
    return prompt_token_ids(tokenizer, prompt)[-max_prompt_length:]


def encode_response(tokenizer, prompt: Text, response: Text, add_eos: bool = True) -> list[int]:
    ids = _ids(tokenizer, render_response(tokenizer, prompt, response), special=False)
    eos = tokenizer.eos_token_id
    if add_eos and eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids


def encode_pair(
    tokenizer,
    prompt: Text,
    response: Text,
    max_length: int,
    max_prompt_length: int,
    add_eos: bool = True,
    prompt_ids: list[int] | None = None,
) -> Encoded:
    """Prompt + response fitting in ``max_length``: the prompt keeps its last ``max_prompt_length`` tokens,
    the response is cut at its end first; a prompt that leaves no room for one response token then loses
    its first tokens. ``prompt_ids``: the prompt's ids when already encoded (all of them)."""
    full = prompt_token_ids(tokenizer, prompt) if prompt_ids is None else prompt_ids
    prompt_ids = full[-max_prompt_length:]
    prompt_ids = prompt_ids[max(len(prompt_ids) - max(max_length - 1, 1), 0) :]
    response_ids = encode_response(tokenizer, prompt, response, add_eos)
    room = max(max_length - len(prompt_ids), 1)
    return Encoded(prompt_ids, response_ids[:room], len(full) + len(response_ids))


def encode_preference(
    tokenizer, ex: PreferenceExample, max_length: int, max_prompt_length: int
) -> tuple[Encoded, Encoded]:
    prompt_ids = prompt_token_ids(tokenizer, ex.prompt)
    return (
        encode_pair(tokenizer, ex.prompt, ex.chosen, max_length, max_prompt_length, prompt_ids=prompt_ids),
        encode_pair(tokenizer, ex.prompt, ex.rejected, max_length, max_prompt_length, prompt_ids=prompt_ids),
    )


def encode_sft(tokenizer, ex: SFTExample, max_length: int, max_prompt_length: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` where labels are IGNORE_INDEX except on completion/assistant tokens."""
    input_ids, labels, _ = encode_sft_counted(tokenizer, ex, max_length, max_prompt_length)
    return input_ids, labels


def encode_sft_counted(
    tokenizer, ex: SFTExample, max_length: int, max_prompt_length: int
) -> tuple[list[int], list[int], int]:
    """``encode_sft``'s ``(input_ids, labels)`` and the row's tokens before any cut."""
    if ex.messages is None:
        enc = encode_pair(tokenizer, ex.prompt, ex.completion, max_length, max_prompt_length)
        ids = enc.prompt_ids + enc.response_ids
        return ids, [IGNORE_INDEX] * len(enc.prompt_ids) + enc.response_ids, enc.full_length
    input_ids: list[int] = []
    labels: list[int] = []
    chat = has_chat_template(tokenizer)
    for i, (text, trained) in enumerate(conversation_segments(tokenizer, ex.messages)):
        ids = _ids(tokenizer, text, special=(i == 0 and not chat))
        if trained and not chat and tokenizer.eos_token_id is not None:
            ids = ids + [tokenizer.eos_token_id]
        input_ids += ids
        labels += ids if trained else [IGNORE_INDEX] * len(ids)
    return input_ids[:max_length], labels[:max_length], len(input_ids)
