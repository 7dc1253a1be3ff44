"""What every training command does around its loop: output dir, config, accelerator, logger, checkpoints.

Trainers compose these pieces (no base class): ``open_session`` at the start, ``session.save`` every
``--save-steps``, ``session.close`` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlhfkit.config.parse import save_config
from rlhfkit.config.parts import OptimArgs, RunArgs
from rlhfkit.errors import UserError
from rlhfkit.models.lora import save_pretrained
from rlhfkit.training import updates
from rlhfkit.training.checkpoint import Checkpointer, rng_state, set_rng_state
from rlhfkit.training.logger import MetricsLogger
from rlhfkit.training.runtime import make_accelerator, seed_everything
from rlhfkit.training.stream import IndexStream


@dataclass
class Session:
    accelerator: object
    logger: MetricsLogger
    checkpointer: Checkpointer
    output_dir: Path
    start_step: int
    total_steps: int

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def save(self, step: int, models: dict, state: dict) -> None:
        """Checkpoint ``models`` (name -> module) and ``state`` (optimizer, scheduler, stream, ...)."""
        self.accelerator.wait_for_everyone()
        if self.is_main:
            unwrapped = {k: self.accelerator.unwrap_model(m) for k, m in models.items()}
            state = {**state, "rng": rng_state()}
            self.checkpointer.save(step, unwrapped, state)

    def restore(self, models: dict) -> dict:
        """Load the newest checkpoint into ``models``; returns its state (RNG already restored)."""
        path = self.checkpointer.resume_point()
        _, state = self.checkpointer.load(path, {k: self.accelerator.unwrap_model(m) for k, m in models.items()})
        set_rng_state(state["rng"])
        return state

    def eval_due(self, step: int, eval_steps: int) -> bool:
        """Evaluate every ``eval_steps`` steps (0: never) and always at the last step."""
        return bool(eval_steps and step % eval_steps == 0) or step == self.total_steps

    def log_due(self, step: int, run: RunArgs, metrics: dict) -> bool:
        """Log every --logging-steps, at the last step, and whenever a step has held-out or gold metrics."""
        evaluated = any(k.startswith("eval/") or k == "reward/gold" for k in metrics)
        return bool(metrics) and (step % run.logging_steps == 0 or step == self.total_steps or evaluated)

    def save_due(self, step: int, run: RunArgs) -> bool:
        """Checkpoint every --save-steps (0: never)."""
        return bool(run.save_steps) and step % run.save_steps == 0

    def end_step(self, step: int, run: RunArgs, metrics: dict, trainables: Trainables) -> None:
        """Log and checkpoint when due, advance the progress bar."""
        if self.log_due(step, run, metrics):
            self.logger.log(step, metrics)
        if self.save_due(step, run):
            self.save(step, {"model": trainables.model}, trainables.state_dict())
        self.logger.advance()

    def close(self) -> None:
        self.logger.close()

    def finish(self, model, tokenizer) -> None:
        """The final model in Hugging Face format (LoRA: merged, the adapter under adapter/), written by
        the main process once every process is done; then close the logger."""
        self.accelerator.wait_for_everyone()
        if self.is_main:
            save_pretrained(self.accelerator.unwrap_model(model), tokenizer, self.output_dir)
        self.close()


@dataclass
class Trainables:
    """What an SFT / RM / DPO step updates, and what its checkpoint restores."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    stream: IndexStream

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "stream": self.stream.state_dict(),
        }


def prepare_trainables(session: Session, model, optim_args: OptimArgs, n_rows: int, seed: int) -> Trainables:
    """AdamW + schedule over ``session.total_steps``, ``accelerate.prepare``, the data stream; on resume,
    all of them (and the model) restored from the newest checkpoint."""
    optimizer = updates.build_optimizer(model, optim_args)
    scheduler = updates.build_scheduler(optimizer, optim_args, session.total_steps)
    model, optimizer = session.accelerator.prepare(model, optimizer)
    trainables = Trainables(model, optimizer, scheduler, IndexStream(n_rows, seed))
    if session.start_step > 0:  # only --resume sets a start step
        state = session.restore({"model": model})
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        trainables.stream.load_state_dict(state["stream"])
    return trainables


def open_session(config, run: RunArgs, total_steps: int, desc: str) -> Session:
    """Seed, create the output dir, write ``config.yaml``, and find the resume point if ``--resume``."""
    out = Path(run.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --output-dir exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create --output-dir ({exc.strerror})") from None
    seed_everything(run.seed)
    accelerator = make_accelerator(run)
    checkpointer = Checkpointer(out, run.save_total_limit)
    start = 0
    if run.resume:
        path = checkpointer.resume_point()
        start = int(path.name.split("-")[1])
    if accelerator.is_main_process:
        save_config(config, out)
    logger = MetricsLogger(
        out, total_steps, start, enabled=accelerator.is_main_process, progress=run.progress, desc=desc
    )
    return Session(accelerator, logger, checkpointer, out, start, total_steps)
