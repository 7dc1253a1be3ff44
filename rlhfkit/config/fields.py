"""Read the docstrings written under dataclass fields, so each option is documented once.

@dataclass
class OptimArgs:
    learning_rate: float = 1e-5
    \"\"\"Peak learning rate of AdamW.\"\"\"
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterable
from functools import cache


@dataclasses.dataclass(frozen=True)
class Choices:
    """The allowed values of an option typed ``Annotated[str, Choices(names)]``: ``names()`` is read each time
    the option is parsed or shown, so they can come from a registry (e.g. the advantage estimators), where a new
    entry becomes a valid choice as soon as it is registered."""

    names: Callable[[], Iterable[str]]


def choices(tp) -> tuple | None:
    """The allowed values of an option's type: a ``Literal``'s, or an ``Annotated[str, Choices(...)]``'s; None
    for any other type."""
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) is typing.Annotated:
        for extra in tp.__metadata__:
            if isinstance(extra, Choices):
                return tuple(extra.names())
    return None


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each field of the dataclass ``cls`` (and its bases) to the string literal that follows it."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
        for f in dataclasses.fields(klass):  # shared options carry their help in the field's metadata
            if "doc" in f.metadata:
                docs[f.name] = f.metadata["doc"]
    return docs
