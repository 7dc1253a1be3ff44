"""The commands: each one's config dataclass (its options), its entry point and its summary, and ``execute``,
which runs one on a parsed config. The command line (``rlhfkit.cli``), the Python API (``rlhfkit.api``) and the
stages of ``rlhfkit iterate`` and ``rlhfkit demo`` all run commands through here.

A command's entry point is named as ``"module:function"`` and imported only when the command runs: the
trainers, transformers and the web pages load for the command that needs them, not for ``--help``.

Library modules report what a command is doing through ``logging.getLogger(__name__)``, under the ``rlhfkit``
logger. ``messages_shown`` shows those messages on stderr as short lines for a command's length: the command
line always (INFO, DEBUG with ``--debug``), the Python API where the program has not set up logging itself.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

from tqdm import tqdm

from rlhfkit import accel
from rlhfkit.config import commands as c
from rlhfkit.config.iterate import IterateConfig
from rlhfkit.config.judging import JudgeConfig, ReviseConfig
from rlhfkit.config.parse import flat_dict, parse_config
from rlhfkit.training.logger import close_progress_bars
from rlhfkit.training.runtime import cpu_threads
from rlhfkit.training.session import check_output_dir


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
        "the built-in customer-support task end to end (SFT, reward model, PPO, PPO without KL, DPO, iterated PPO, "
        "online DPO) with a report",
    ),
}


def execute(name: str, config):
    """Run command ``name`` on a parsed config under its ``--accel`` mode and on its ``--threads`` CPU threads;
    returns what the command returns. The SIGTERM/SIGINT handlers a training session installs, and torch's thread
    count, are put back as they were, however the command ends."""
    module, func = COMMANDS[name].target.split(":")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    options = flat_dict(config)
    run = getattr(config, "run", None)
    if run is not None and launched_world() == 1:  # before any model loads (a launcher's processes check later)
        check_output_dir(run)
    # a command that runs no model (label, view, init-model) has no --accel
    switch = (
        accel.switched(options["accel"], bool(options.get("cpu", False)), options)
        if "accel" in options
        else nullcontext()
    )
    try:
        with switch, cpu_threads(options.get("threads") or 0):
            return getattr(importlib.import_module(module), func)(config)
    except BaseException:
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


def launched_rank() -> int:
    """The rank a launcher (torchrun, accelerate launch) gave this process; 0 when run alone."""
    return int(os.environ.get("RANK", "0") or 0)


def launched_world() -> int:
    """The number of processes a launcher started; 1 when run alone."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


class _Stderr(logging.Handler):
    """Writes each record as one short line to the ``sys.stderr`` of the moment, through tqdm, so that an open
    progress bar is redrawn below the line rather than broken by it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


class _Short(logging.Formatter):
    """INFO as the bare message; warnings and errors with their level in front; DEBUG with the module's name."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {text}"
        if record.levelno < logging.INFO:
            return f"[{record.name}] {text}"
        return text


@contextlib.contextmanager
def messages_shown(level: int = logging.INFO, *, unless_configured: bool = False) -> Iterator[None]:
    """Show the ``rlhfkit`` logger's messages from ``level`` up on stderr while the block runs; the logger's
    level and handlers are put back afterwards. ``unless_configured``: leave logging alone where the program
    set it up itself (a handler on the root or the ``rlhfkit`` logger, or a level on the latter)."""
    logger = logging.getLogger("rlhfkit")
    if unless_configured and (logger.handlers or logging.getLogger().handlers or logger.level != logging.NOTSET):
        yield
        return
    handler = _Stderr()
    handler.setFormatter(_Short())
    before = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
