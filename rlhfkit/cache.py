"""rlhfkit's cache folder: ``$RLHFKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlhfkit``, else ``~/.cache/rlhfkit``.

It holds what is slow to compute and safe to keep between runs: the CPU kernel timings' verdicts
(``rlhfkit.accel.onednn``) and models de-quantised from ``.gguf`` files (``rlhfkit.models.gguf``).
Deleting it costs only the time to compute them again.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("RLHFKIT_CACHE_DIR"):
        return Path(os.environ["RLHFKIT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlhfkit"
