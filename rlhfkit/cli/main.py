"""`rlhfkit COMMAND [--config FILE.yaml] [--option value ...]`: the command line over ``rlhfkit.commands``.

Here is what only the command line has: reading argv, the usage and version lines, the libraries' chatter
silenced, rlhfkit's log messages shown on stderr (INFO; DEBUG with ``--debug``), and errors printed as one line
with an exit status. The commands themselves (their configs, entry
points and ``execute``) are ``rlhfkit.commands``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from importlib import metadata

import torch.distributed as dist

from rlhfkit import __version__
from rlhfkit.commands import COMMANDS, Command, execute, launched_rank, launched_world, messages_shown, run_command
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import Preempted, UserError

__all__ = ["COMMANDS", "Command", "entry", "execute", "launched_rank", "launched_world", "main", "run_command"]


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: rlhfkit COMMAND [--config FILE.yaml] [--option value ...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()]
    lines += ["", "`rlhfkit COMMAND --help` lists every option with its default; `rlhfkit --version` the versions."]
    return "\n".join(lines)


def version() -> str:
    """rlhfkit's version and those of the libraries it runs on (read from the installed packages' metadata,
    so nothing heavy is imported)."""
    found = []
    for name in ("torch", "transformers", "accelerate", "peft", "datasets", "tokenizers"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    python = ".".join(map(str, sys.version_info[:3]))
    return f"rlhfkit {__version__} (Python {python}; {', '.join(found)})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("--version", "-V", "version"):
        print(version())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rlhfkit: unknown command '{name}' (commands: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    command = COMMANDS[name]
    debug = "--debug" in rest
    try:
        config, debug = parse_config(f"rlhfkit {name}", command.config, rest, command.summary)
        _quiet_libraries(debug)
        # the main process tells what it does; the others of a launcher's job only what went wrong
        level = logging.DEBUG if debug else logging.INFO if launched_rank() == 0 else logging.WARNING
        with messages_shown(level):
            execute(name, config)
        _close_process_group()
    except Preempted as exc:
        if launched_rank() == 0:
            print(str(exc), file=sys.stderr)
        return exc.exit_code
    except UserError as exc:
        # Every process validates the same inputs: the main one reports, once.
        if debug:
            traceback.print_exc()
        if launched_rank() == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:  # argparse's --help (code 0)
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if launched_world() == 1:
            raise
        # One process of several failed (or lost a peer): one line naming it; the launcher stops the rest.
        if debug:
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"error: process {launched_rank()} of {launched_world()}: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


ERROR_GRACE_S = 3.0


def entry() -> None:
    """The `rlhfkit` program (and `python -m rlhfkit`): ``main``, then exit with its status. Under a launcher the
    process ends right after its output is flushed: past the end of the command, the interpreter's teardown of
    torch.distributed's C++ state (gloo's and the store's threads) can abort a process that finished its work
    ("terminate called without an active exception"), turning a good run into a failed one."""
    code = main()
    if launched_world() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        if code != 0 and launched_rank() != 0:
            # the main process reports an error every process met; the launcher stops the others when the first
            # one exits, so the rest give it a moment to print
            time.sleep(ERROR_GRACE_S)
        os._exit(code)
    sys.exit(code)


def _close_process_group() -> None:
    """Under a launcher, end the process group once every process is done: its last collective is then the
    barrier here, not whatever the interpreter's teardown meets."""
    if launched_world() == 1:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _quiet_libraries(debug: bool) -> None:
    """The command line's environment: no hub access at all, and other libraries' chatter silenced."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not debug:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        logging.getLogger("transformers").setLevel(logging.ERROR)
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()  # "Loading weights" bars would drown our own progress
        except ImportError:
            pass


if __name__ == "__main__":
    entry()
