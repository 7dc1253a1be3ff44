"""`rlhfkit COMMAND [--config FILE.yaml] [--option value ...]`.

Each command is a config dataclass (its flags) and a function that takes the parsed config. Trainers
are imported only when their command runs, so `--help` stays fast.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass

from rlhfkit.config import commands as c
from rlhfkit.config.iterate import IterateConfig
from rlhfkit.config.judging import JudgeConfig, ReviseConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import Preempted, UserError


@dataclass(frozen=True)
class Command:
    config: type
    target: str  # "module:function" called with the parsed config
    summary: str


COMMANDS: dict[str, Command] = {
    "init-model": Command(
        c.InitModelConfig,
        "rlhfkit.models.init_model:init_model",
        "build a small random causal LM and a BPE tokenizer trained on local text",
    ),
    "sft": Command(
        c.SFTConfig, "rlhfkit.trainers.sft:train", "supervised fine-tuning on prompt/completion or chat data"
    ),
    "rm": Command(c.RMConfig, "rlhfkit.trainers.rm:train", "reward model from preference pairs (Bradley-Terry)"),
    "ppo": Command(
        c.PPOConfig,
        "rlhfkit.trainers.online:train",
        "PPO against a reward model with a KL penalty to a frozen reference",
    ),
    "grpo": Command(
        c.GRPOConfig,
        "rlhfkit.trainers.online:train",
        "GRPO: several completions per prompt, group-normalised rewards, no critic (Python reward functions)",
    ),
    "rloo": Command(
        c.RLOOConfig,
        "rlhfkit.trainers.online:train",
        "RLOO: several completions per prompt, leave-one-out baseline, no critic (Python reward functions)",
    ),
    "dpo": Command(
        c.DPOConfig, "rlhfkit.trainers.dpo:train", "direct preference optimisation (sigmoid / ipo / label smoothing)"
    ),
    "merge": Command(
        c.MergeConfig,
        "rlhfkit.models.merge:run",
        "merge a LoRA adapter into its base model -> a full model folder (as a run with --save-merged writes)",
    ),
    "iterate": Command(
        IterateConfig,
        "rlhfkit.iterated:run",
        "iterated RLHF: rounds of on-policy pairs -> judge or people -> reward model updated -> PPO continued",
    ),
    "judge": Command(
        JudgeConfig,
        "rlhfkit.judging.run:run",
        "a local model labels pairs (RLAIF): both orders asked, ties dropped -> prefs.jsonl, agreement with people",
    ),
    "revise": Command(
        ReviseConfig,
        "rlhfkit.judging.revise:run",
        "Constitutional AI's supervised stage: answer, critique by a principle, revise -> sft.jsonl, pairs.jsonl",
    ),
    "generate": Command(c.GenerateConfig, "rlhfkit.inference.generate:run", "sample responses for prompts -> JSONL"),
    "score": Command(
        c.ScoreConfig, "rlhfkit.inference.score:run", "reward-model scores for prompt/response rows -> JSONL"
    ),
    "eval": Command(
        c.EvalConfig,
        "rlhfkit.inference.evaluate:run",
        "sample a policy on prompts: RM score, gold score, KL to a reference, length, diversity -> JSON",
    ),
    "label": Command(
        c.LabelConfig,
        "rlhfkit.labelling.app:run",
        "a web page where people compare pairs of responses -> prefs.jsonl for rm / dpo (--export)",
    ),
    "view": Command(
        c.ViewConfig,
        "rlhfkit.viewer.app:run",
        "a web page of training runs: every metric's curve (runs overlaid), samples by step, the report",
    ),
    "demo": Command(
        c.DemoConfig,
        "rlhfkit.demo.pipeline:run",
        "the built-in customer-support task end to end (SFT, RM, PPO, PPO without KL, DPO) with a report",
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: rlhfkit COMMAND [--config FILE.yaml] [--option value ...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()]
    lines += ["", "`rlhfkit COMMAND --help` lists every option with its default; `rlhfkit --version` the versions."]
    return "\n".join(lines)


def version() -> str:
    """rlhfkit's version and those of the libraries it runs on (read from the installed packages' metadata,
    so nothing heavy is imported)."""
    from importlib import metadata

    from rlhfkit import __version__

    found = []
    for name in ("torch", "transformers", "accelerate", "peft", "datasets", "tokenizers"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    python = ".".join(map(str, sys.version_info[:3]))
    return f"rlhfkit {__version__} (Python {python}; {', '.join(found)})"


def execute(name: str, config):
    """Run command ``name`` on a parsed config under its ``--accel`` mode and on its ``--threads`` CPU threads;
    returns what the command returns. The SIGTERM/SIGINT handlers a training session installs, and torch's thread
    count, are put back as they were, however the command ends."""
    from rlhfkit.accel import switched
    from rlhfkit.config.parse import flat_dict
    from rlhfkit.training.runtime import cpu_threads

    module, func = COMMANDS[name].target.split(":")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    options = flat_dict(config)
    run = getattr(config, "run", None)
    if run is not None and launched_world() == 1:  # before any model loads (a launcher's processes check later)
        from rlhfkit.training.session import check_output_dir

        check_output_dir(run)
    # a command that runs no model (label, view, init-model) has no --accel
    accel = switched(options["accel"], cpu=bool(options.get("cpu", False))) if "accel" in options else nullcontext()
    try:
        with accel, cpu_threads(options.get("threads") or 0):
            return getattr(importlib.import_module(module), func)(config)
    except BaseException:
        from rlhfkit.training.logger import close_progress_bars

        close_progress_bars()  # before the caller prints the error
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


def run_command(name: str, argv: list[str]):
    """Parse ``argv`` exactly as ``rlhfkit NAME ...`` does and run the command (errors raise UserError)."""
    config, _ = parse_config(f"rlhfkit {name}", COMMANDS[name].config, argv, COMMANDS[name].summary)
    return execute(name, config)


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
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def launched_rank() -> int:
    """The rank a launcher (torchrun, accelerate launch) gave this process; 0 when run alone."""
    return int(os.environ.get("RANK", "0") or 0)


def launched_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


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
