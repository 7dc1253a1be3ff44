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
from functools import cache


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
