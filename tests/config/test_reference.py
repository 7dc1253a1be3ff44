"""docs/cli.md's option tables are generated from the config dataclasses; the page must match the code."""

from __future__ import annotations

import re
from pathlib import Path

from rlhfkit.cli.main import COMMANDS
from rlhfkit.cli.reference import MARKER, generated, render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_page_lists_every_option_of_every_command_as_the_code_defines_it():
    page = PAGE.read_text(encoding="utf-8")
    assert MARKER in page
    assert page == render(page), "docs/cli.md is out of date: run `python -m rlhfkit.cli.reference docs/cli.md`"
    for name in COMMANDS:
        assert f"## rlhfkit {name}\n" in generated()


def test_every_flag_of_help_is_in_the_table(capsys):
    from rlhfkit.cli.main import main

    table = generated()
    for name in ("sft", "ppo", "generate"):
        assert main([name, "--help"]) == 0
        words = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", capsys.readouterr().out))
        flags = {w for w in words if "_" not in w}  # the underscore spellings are aliases of these
        flags -= {"--help", "--config", "--debug"}
        missing = [f for f in flags if f"`{f} " not in table]
        assert not missing, missing
