"""Options that several commands share, each defined once: its type comes from the field's annotation,
its help text from here, and a part may give it another default.

    @dataclass
    class IOArgs:
        seed: int = options.seed()
        batch_size: int = options.batch_size(16)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any


def option(default: Any, doc: str) -> Any:
    """A dataclass field with ``doc`` as its help text (``fields.field_docs`` reads it)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def seed(default: int = 42) -> Any:
    return option(default, "Random seed for data order, initialisation and sampling.")


def cpu() -> Any:
    return option(False, "Run on the CPU even when a GPU is present.")


def dist_timeout() -> Any:
    return option(
        600,
        "Seconds a process waits for the others at a collective step (gathering rows, syncing gradients) before "
        "the whole job stops with an error naming the waiting rank; guards against a silent hang when a rank "
        "dies. Only used with several processes.",
    )


def batch_size(default: int) -> Any:
    return option(
        default,
        "Rows per optimizer step over all processes (sft/rm/dpo: examples; ppo/grpo/rloo: completions, i.e. "
        "prompts x --num-generations), split evenly over the processes and then into "
        "--gradient-accumulation-steps micro-batches; generate/score/eval: rows per forward pass.",
    )


def trust_remote_code() -> Any:
    return option(False, "Run Python code shipped inside the model directory. Off unless you trust that code.")


def max_prompt_length(default: int = 128) -> Any:
    return option(
        default,
        "Longest prompt in tokens. A prompt to sample from (ppo, grpo, rloo, generate, eval) that is longer stops "
        "the run unless --truncate-prompts; elsewhere (sft, rm, dpo, score) a longer prompt keeps its last tokens.",
    )


ACCEL_SWITCH = "RLHFKIT_ACCEL"  # the environment's --accel default, read by rlhfkit.accel as well


def accel_mode_from_environment() -> str:
    """``off`` where ``RLHFKIT_ACCEL`` is 0 / false / off / no, else ``auto``: the default of ``--accel``."""
    return "off" if os.environ.get(ACCEL_SWITCH, "1").strip().lower() in ("0", "false", "off", "no") else "auto"


def accel() -> Any:
    return dataclasses.field(
        default_factory=accel_mode_from_environment,
        metadata={
            "doc": "The performance code: 'auto' turns on what applies on the device the run computes on (on the "
            "CPU all of it; on a GPU the kernel swaps, the lean decode step and the block-wise vocabulary log-probs, "
            "batches padded); 'off' runs plain transformers and rlhfkit.ops, with the same results up to float "
            "rounding. Default: 'off' where RLHFKIT_ACCEL=0 is set, else 'auto'. --pack-sequences, "
            "--value-pass-apart and --compile-decode apply under 'auto' only."
        },
    )


def threads(default: int = 0) -> Any:
    return option(
        default,
        "torch CPU threads for the command's work (torch.set_num_threads, and the inter-op pool where it can "
        "still be set); 0: torch's default, one per core.",
    )
