"""Where a faster implementation may stand in for a plain one, without the plain code knowing which.

A function marked ``@replaceable`` runs as written until an implementation is installed for it; then every call
goes to that implementation, which is given the plain function as its first argument and calls it wherever
it does not apply. Calls made through any import of the function follow the installation.

    @replaceable
    def response_token_stats(model, input_ids, ...): ...        # the plain PyTorch pass

    install(response_token_stats, lambda plain, model, *a, **k: ...)  # e.g. by rlhfkit.accel, for a command

``rlhfkit.accel`` installs its implementations while a command runs under ``--accel auto`` (``installed``) and
takes them away afterwards, so under ``--accel off`` (and outside a command) the plain functions run.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

_INSTALLED: dict[str, Callable] = {}


def replaceable(plain: Callable) -> Callable:
    """``plain``, callable as before, with a slot for an implementation to stand in for it (``install``)."""
    key = f"{plain.__module__}.{plain.__qualname__}"

    @functools.wraps(plain)
    def call(*args, **kwargs):
        fast = _INSTALLED.get(key)
        return plain(*args, **kwargs) if fast is None else fast(plain, *args, **kwargs)

    call.plain = plain
    call.key = key
    return call


def install(function: Callable, implementation: Callable) -> None:
    """Route calls of ``function`` (a ``replaceable``) to ``implementation(plain, *args, **kwargs)``."""
    _INSTALLED[function.key] = implementation


@contextlib.contextmanager
def installed(implementations: dict[Callable, Callable]):
    """For the length of the block exactly these ``{function: implementation}`` are installed (none: the plain
    functions run), then what was installed before is put back."""
    before = dict(_INSTALLED)
    _INSTALLED.clear()
    try:
        for function, implementation in implementations.items():
            install(function, implementation)
        yield
    finally:
        _INSTALLED.clear()
        _INSTALLED.update(before)


def current(function: Callable) -> Callable | None:
    """The implementation installed for ``function``, or None (the plain one runs)."""
    return _INSTALLED.get(function.key)
