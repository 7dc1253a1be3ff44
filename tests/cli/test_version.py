"""`rlhfkit --version`: the package's version (one source: ``rlhfkit.__version__``, which the installed
metadata takes too) and the versions of the libraries it runs on."""

from __future__ import annotations

from importlib import metadata

import rlhfkit
from rlhfkit.cli.main import main


def test_version_names_rlhfkit_and_its_libraries(capsys):
    for flag in ("--version", "-V"):
        assert main([flag]) == 0
        out = capsys.readouterr().out.strip()
        assert out.startswith(f"rlhfkit {rlhfkit.__version__} (")
        assert f"transformers {metadata.version('transformers')}" in out
        assert f"torch {metadata.version('torch')}" in out


def test_installed_metadata_carries_the_packages_version():
    assert metadata.version("rlhfkit") == rlhfkit.__version__
