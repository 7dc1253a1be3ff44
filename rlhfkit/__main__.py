"""`python -m rlhfkit COMMAND ...`: the same as the `rlhfkit` command."""

import sys

from rlhfkit.cli.main import main

sys.exit(main())
