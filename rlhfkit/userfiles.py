"""Python objects named on the command line as ``FILE.py:NAME``: reward functions, tools, environments.

The file is imported as ``python FILE.py`` would import it (its own folder importable, so it can import a
helper module beside it). Every failure is one line naming the option, the file and the reason.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from rlhfkit.config.parse import PYTHON_FUNCTION
from rlhfkit.errors import UserError, option


def replayed_callable(flag: str, spec: str) -> None:
    """Refuse a ``<python function ...>`` read back from the config.yaml of a run given a Python callable."""
    if spec.startswith(PYTHON_FUNCTION):
        raise UserError(
            f"{option(flag, spec)}: the run this config comes from was given a Python callable, which "
            "config.yaml records by name only; give it again, as FILE.py:NAME (or as a callable in Python)"
        )


def load_object(flag: str, spec: str, path: Path, name: str, what: str = "function") -> Any:
    """``name`` from the Python file ``path``; ``flag`` is the option it came with (for messages), ``what``
    the kind of object expected (a class must be a class, anything else callable)."""
    if not path.is_file():
        raise UserError(f"{option(flag, spec)}: {path} does not exist")
    module_name = f"rlhfkit_user_{abs(hash(path.resolve()))}"
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: report why it cannot be imported, in one line
        sys.modules.pop(module_name, None)
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(f"{option(flag, spec)}: cannot import {path} ({type(exc).__name__}: {detail})") from None
    obj = getattr(module, name, None)
    if obj is None:
        raise UserError(f"{option(flag, spec)}: {path} has no '{name}'")
    if what == "class" and not isinstance(obj, type):
        raise UserError(f"{option(flag, spec)}: '{name}' in {path} is not a class")
    if not callable(obj):
        raise UserError(f"{option(flag, spec)}: '{name}' in {path} is not a {what}")
    return obj


def split_spec(flag: str, spec: str) -> tuple[Path, str]:
    """``FILE.py:NAME`` -> (path, name); one line naming the option when the form is wrong."""
    replayed_callable(flag, spec)
    location, _, name = spec.rpartition(":")
    if not location or not name or not location.endswith(".py"):
        raise UserError(f"{option(flag, spec)}: give it as FILE.py:NAME")
    return Path(location), name
