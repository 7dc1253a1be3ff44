"""`python -m rlhfkit COMMAND ...`: the same as the `rlhfkit` command."""

from rlhfkit.cli.main import entry

entry()
