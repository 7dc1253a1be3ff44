"""Range checks that configs run on their options; each raises a UserError naming the option as the caller
spells it (``--max-steps`` on the command line, ``max_steps`` in the Python API)."""

from __future__ import annotations

from pathlib import Path

from rlhfkit.config import trackers
from rlhfkit.config.parts import LoraArgs, OptimArgs, RunArgs, StoppingArgs
from rlhfkit.errors import UserError, option


def positive(**values) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise UserError(f"{option(name)} must be > 0, got {value}")


def at_least(low, **values) -> None:
    for name, value in values.items():
        if value < low:
            raise UserError(f"{option(name)} must be >= {low}, got {value}")


def check_training(optim: OptimArgs, run: RunArgs, lora: LoraArgs | None = None) -> None:
    positive(
        learning_rate=optim.learning_rate,
        batch_size=optim.batch_size,
        gradient_accumulation_steps=optim.gradient_accumulation_steps,
        num_epochs=optim.num_epochs,
        logging_steps=run.logging_steps,
        save_total_limit=run.save_total_limit,
    )
    at_least(
        0,
        warmup_steps=optim.warmup_steps,
        schedule_steps=optim.schedule_steps,
        weight_decay=optim.weight_decay,
        max_grad_norm=optim.max_grad_norm,
        save_steps=run.save_steps,
        threads=run.threads,
    )
    at_least(-1, eval_steps=run.eval_steps)
    if run.resume and run.overwrite_output_dir:
        raise UserError(
            f"{option('resume', True)} continues the run in {option('output_dir')}; "
            f"{option('overwrite_output_dir', True)} empties it first: give one"
        )
    if optim.max_steps == 0 or optim.max_steps < -1:
        raise UserError(f"{option('max_steps')} must be > 0 or -1, got {optim.max_steps}")
    if 0 < optim.schedule_steps < optim.max_steps:
        raise UserError(
            f"{option('schedule_steps', optim.schedule_steps)} is shorter than the run's "
            f"{option('max_steps', optim.max_steps)}: its last steps would train at a rate of 0"
        )
    if optim.optimizer_state and not Path(optim.optimizer_state).exists():
        raise UserError(f"{optim.optimizer_state}: {option('optimizer_state')} does not exist")
    if lora is not None:
        at_least(0, lora_r=lora.lora_r)
    run.report_to = trackers.check(run.report_to)  # comma-separated names split; a missing package named now


def check_stopping(stopping: StoppingArgs, run: RunArgs, eval_data: str) -> None:
    """--keep-best and --patience watch periodic held-out evaluations: they need --eval-data and --eval-steps > 0."""
    at_least(0, patience=stopping.patience)
    if not (stopping.keep_best or stopping.patience):
        return
    what = option("keep_best", True) if stopping.keep_best else option("patience")
    if not eval_data:
        raise UserError(f"{what} picks a step by the held-out loss: give {option('eval_data')}")
    if run.eval_steps <= 0:
        raise UserError(
            f"{what} compares held-out evaluations during training: give {option('eval_steps')} > 0 "
            f"(got {run.eval_steps})"
        )
