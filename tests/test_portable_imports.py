"""Every module of the package imports where POSIX-only modules do not exist (Windows has no ``fcntl``): file locks
go through ``filelock``, which picks the platform's own locking."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter, so that hiding fcntl touches no other test. ``None`` in ``sys.modules`` makes
# ``import fcntl`` raise ModuleNotFoundError, as it does on Windows. ``rlhfkit.__main__`` runs the command line.
IMPORT_ALL = textwrap.dedent(
    """
    import importlib, pkgutil, sys, warnings
    warnings.simplefilter("ignore")
    sys.modules["fcntl"] = None
    import rlhfkit
    failed = []
    for info in pkgutil.walk_packages(rlhfkit.__path__, "rlhfkit.", onerror=failed.append):
        if info.name == "rlhfkit.__main__":
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
    print("\\n".join(failed))
    sys.exit(1 if failed else 0)
    """
)


def test_every_module_imports_without_fcntl():
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
