"""Token lengths said, never cut silently.

A prompt to sample from that is longer than ``--max-prompt-length`` stops the run (how many, the longest)
unless ``--truncate-prompts`` says to keep their last tokens; a training row that loses tokens to
``--max-length`` / ``--max-prompt-length`` is counted at the start; and a sequence longer than the model's
positions (config.json's ``max_position_embeddings`` or its equivalent) stops the run before any weights
load. Rows are numbered from 1 in the order of the data file.
"""

from __future__ import annotations

import logging

from rlhfkit.data.encode import prompt_token_ids
from rlhfkit.errors import UserError, option

logger = logging.getLogger(__name__)

Positions = tuple[int, str] | None  # the most positions a model reads, and its config.json key; None: no limit


def note(message: str) -> None:
    """One ``note:`` message (the command line shows the first process's only: every process reads the same
    data)."""
    logger.info("note: %s", message)


def _longest(lengths: list[int], rows: list[int]) -> str:
    i = max(rows, key=lambda r: lengths[r])
    return f"the longest: row {i + 1}, {lengths[i]} tokens"


def encode_prompts(tokenizer, prompts: list, max_prompt_length: int, truncate: bool, path: str) -> list[list[int]]:
    """Each prompt's ids to sample from. Prompts longer than ``max_prompt_length`` stop the run with one line
    (how many, the longest) unless ``truncate``; then they keep their last ``max_prompt_length`` tokens and
    a note says how many did."""
    full = [prompt_token_ids(tokenizer, p) for p in prompts]
    lengths = [len(ids) for ids in full]
    long = [i for i, n in enumerate(lengths) if n > max_prompt_length]
    if long:
        said = (
            f"{path}: {len(long)} of {len(full)} prompts are longer than "
            f"{option('max_prompt_length', max_prompt_length)} tokens ({_longest(lengths, long)})"
        )
        if not truncate:
            raise UserError(
                f"{said}: raise {option('max_prompt_length')}, or give {option('truncate_prompts')} to keep the "
                f"last {max_prompt_length} tokens of each"
            )
        note(f"{said}; each keeps its last {max_prompt_length} ({option('truncate_prompts')})")
    return [ids[-max_prompt_length:] for ids in full]


def check_generation_fits(
    model: str, limit: Positions, prompt_ids: list[list[int]], max_new_tokens: int, max_total_tokens: int = 0
):
    """A UserError when the longest prompt plus ``max_new_tokens`` (or a conversation's ``max_total_tokens``)
    is more than the positions of the model at ``model`` (``limit``: ``rlhfkit.models.loading.position_limit``);
    nothing when its config names no limit."""
    if limit is None:
        return
    positions, key = limit
    where = f"{model}: the model reads at most {positions} positions ({key} in config.json)"
    if max_total_tokens > positions:
        raise UserError(f"{where}, fewer than {option('max_total_tokens', max_total_tokens)}: lower it")
    if not prompt_ids:
        return
    longest = max(len(ids) for ids in prompt_ids)
    if longest + max_new_tokens > positions:
        raise UserError(
            f"{where}, fewer than a prompt of {longest} tokens + {option('max_new_tokens', max_new_tokens)}: lower "
            f"{option('max_prompt_length')} (with {option('truncate_prompts')}) or {option('max_new_tokens')}"
        )


def report_rows(full: list[int], kept: list[int], path: str, data_args, model: str, limit: Positions) -> None:
    """For training rows (``full``: each row's tokens before any cut; ``kept``: after): a note counting the
    rows that lost tokens to ``--max-length`` / ``--max-prompt-length`` (``data_args``), and a UserError
    naming the longest kept row when it is longer than the positions of the model at ``model`` (``limit``)."""
    max_length = data_args.max_length
    cut = [i for i, (f, k) in enumerate(zip(full, kept)) if f > k]
    if cut:
        note(
            f"{path}: {len(cut)} of {len(full)} rows do not fit {option('max_length', max_length)} / "
            f"{option('max_prompt_length', data_args.max_prompt_length)} ({_longest(full, cut)}); they are cut: "
            "the response's end first, then the prompt's start"
        )
    if limit is None or not kept:
        return
    positions, key = limit
    longest = max(range(len(kept)), key=lambda i: kept[i])
    if kept[longest] > positions:
        raise UserError(
            f"{path}: row {longest + 1}: {kept[longest]} tokens (within {option('max_length', max_length)}), more "
            f"than the {positions} positions the model reads ({key} in {model}/config.json): lower "
            f"{option('max_length')} to {positions}"
        )


def report_pair_rows(pairs: list, path: str, data_args, model: str, limit: Positions) -> None:
    """``report_rows`` for preference pairs (``(chosen, rejected)`` ``Encoded``): a row is as long as its
    longer reply's sequence."""
    full = [max(c.full_length, r.full_length) for c, r in pairs]
    kept = [max(len(e.prompt_ids) + len(e.response_ids) for e in pair) for pair in pairs]
    report_rows(full, kept, path, data_args, model, limit)
