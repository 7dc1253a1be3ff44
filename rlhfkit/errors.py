"""The project's error type for mistakes a user can fix (bad file, bad flag, missing model), and how its
messages name an option: as the command line spells it (``--max-steps``) or as the Python API does
(``max_steps``), whichever the caller used.

    raise UserError(f"{option('max_steps')} must be > 0 or -1, got {value}")
    # rlhfkit sft --max-steps 0      ->  --max-steps must be > 0 or -1, got 0
    # rlhfkit.sft(max_steps=0, ...)  ->  max_steps must be > 0 or -1, got 0
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Literal

Spelling = Literal["flag", "keyword"]
_SPELLING: ContextVar[Spelling] = ContextVar("rlhfkit_option_spelling", default="flag")
_UNSET: Any = object()
# Options whose Python keyword differs from the config field (the API takes a list where the flag repeats).
KEYWORDS = {"reward_fn": "reward_fns", "tool": "tools"}


class UserError(Exception):
    """A problem with the user's input. The CLI prints its message as one line and exits non-zero.

    Messages name what is wrong and where: the file, the line or row, and the field.
    """


class Preempted(UserError):
    """A run stopped by SIGTERM/SIGINT after checkpointing its last step; the CLI exits with ``exit_code``
    (128 + the signal's number, as a shell reports a process killed by it)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


@contextlib.contextmanager
def spelling(kind: Spelling) -> Iterator[None]:
    """Messages raised inside name options as ``kind``: ``"flag"`` (``--max-steps``, the default, for the
    command line) or ``"keyword"`` (``max_steps``, for the Python API)."""
    token = _SPELLING.set(kind)
    try:
        yield
    finally:
        _SPELLING.reset(token)


def option(name: str, value: Any = _UNSET) -> str:
    """Option ``name`` (a config field, ``snake_case``) as the caller spells it, with ``value`` if given.

    flag: ``--batch-size``, ``--batch-size 16`` (a true boolean: ``--resume``);
    keyword: ``batch_size``, ``batch_size=16``, ``advantage='gae'``; an item of a list option the API
    takes as a list: ``reward_fns item 'f.py:g'``.
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if _SPELLING.get() == "flag":
        flag = "--" + name.replace("_", "-")
        return flag if value is _UNSET or value is True else f"{flag} {value}"
    keyword = KEYWORDS.get(name, name)
    if value is _UNSET:
        return keyword
    return f"{keyword} item {value!r}" if name in KEYWORDS else f"{keyword}={value!r}"


def command(name: str) -> str:
    """Command ``name`` as the caller invokes it: ``rlhfkit rm`` (flag) or ``rlhfkit.rm`` (keyword)."""
    if _SPELLING.get() == "flag":
        return f"rlhfkit {name}"
    return f"rlhfkit.{'evaluate' if name == 'eval' else name.replace('-', '_')}"


def invocation(name: str, **options: Any) -> str:
    """A call of command ``name`` with ``options``: ``rlhfkit rm --model m --output-dir OUT`` (flag) or
    ``rlhfkit.rm(model='m', output_dir='OUT')`` (keyword)."""
    if _SPELLING.get() == "flag":
        return " ".join([command(name)] + [option(key, value) for key, value in options.items()])
    return f"{command(name)}({', '.join(option(key, value) for key, value in options.items())})"


def spelled(flag: str, keyword: str) -> str:
    """One of two phrasings, for a message whose wording (not only an option's name) differs."""
    return flag if _SPELLING.get() == "flag" else keyword
