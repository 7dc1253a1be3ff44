"""What every training command does around its loop: output dir, config, accelerator, logger, checkpoints.

Trainers compose these pieces (no base class): ``open_session`` at the start, ``session.save`` every
``--save-steps``, ``session.stop_if_requested`` after every step (SIGTERM/SIGINT: checkpoint and stop),
``session.close`` at the end.
"""

from __future__ import annotations

import logging
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import torch

from rlhfkit.config.parse import described_options, flat_dict, save_config
from rlhfkit.config.parts import OptimArgs, RunArgs
from rlhfkit.errors import Preempted, UserError, option
from rlhfkit.models.lora import save_pretrained
from rlhfkit.training import engines, trackers, updates
from rlhfkit.training.checkpoint import SHARDS, Checkpointer, rng_state, set_rng_state
from rlhfkit.training.distributed import Ranks, ranks_of
from rlhfkit.training.logger import MetricsLogger
from rlhfkit.training.preemption import StopSignal
from rlhfkit.training.runtime import make_accelerator, seed_everything
from rlhfkit.training.stream import IndexStream

logger = logging.getLogger(__name__)


@dataclass
class Session:
    accelerator: object
    logger: MetricsLogger
    checkpointer: Checkpointer
    output_dir: Path
    start_step: int
    total_steps: int
    stop: StopSignal
    resume_from: Path | None = None  # the checkpoint --resume continues from
    save_merged: bool = (
        True  # --save-merged: a LoRA model's final weights merged (and the adapter) or the adapter alone
    )

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def ranks(self) -> Ranks:
        return ranks_of(self.accelerator)

    def save(self, step: int, models: dict, state: dict, optimizer=None) -> None:
        """Checkpoint ``models`` (name -> module) and ``state`` (optimizer, scheduler, stream, ...) with every
        process's RNG: each rank writes its part, then rank 0 the shared files and the completion marker.
        Under a sharding engine (FSDP) the models and ``optimizer`` are written as one shard per rank
        (``torch.distributed.checkpoint``) and ``state["optimizer"]`` is not used."""
        ranks = self.ranks
        if ranks.is_main:
            self.checkpointer.begin(step)
        self.accelerator.wait_for_everyone()
        self.checkpointer.write_rank(step, ranks.rank, {"rng": rng_state()})
        if engines.sharded(self.accelerator):
            engines.save_sharded(self.checkpointer.tmp_dir(step) / SHARDS, models, optimizer)
            state = {k: v for k, v in state.items() if k != "optimizer"}
            models = {}
        self.accelerator.wait_for_everyone()
        if ranks.is_main:
            unwrapped = {k: self.accelerator.unwrap_model(m) for k, m in models.items()}
            self.checkpointer.save(step, unwrapped, state, world=ranks.world)
        self.accelerator.wait_for_everyone()

    def restore(self, models: dict, optimizer=None) -> dict:
        """Load the newest intact checkpoint into ``models`` (and, under a sharding engine, ``optimizer``);
        returns its state (RNG already restored)."""
        path = self.resume_from or self.checkpointer.resume_point(self.ranks.world)
        if engines.sharded(self.accelerator):
            engines.load_sharded(path / SHARDS, models, optimizer)
            models = {}
        unwrapped = {k: self.accelerator.unwrap_model(m) for k, m in models.items()}
        _, state = self.checkpointer.load(path, unwrapped, self.ranks.rank)
        set_rng_state(state["rank"]["rng"] if "rank" in state else state["rng"])
        return state

    def stop_if_requested(self, step: int, models: dict, state: dict, optimizer=None) -> None:
        """After step ``step``: when SIGTERM/SIGINT arrived on any process, checkpoint this step (unless just
        done) and stop with the way to resume."""
        if not self.stop.requested(self.accelerator):
            return
        if self.checkpointer.latest() != self.checkpointer.root / f"step-{step}":
            self.save(step, models, state, optimizer)
        self.close()
        raise Preempted(
            f"stopped by {self.stop.name()} after step {step} of {self.total_steps}; checkpoint written to "
            f"{self.checkpointer.root / f'step-{step}'}; run the same command with {option('resume', True)} "
            "to continue",
            self.stop.signum or signal.SIGTERM,
        )

    def micro_batch_size(self, optim) -> int:
        """Rows per forward pass on this process: --batch-size split over processes and micro-batches (also
        the chunk size of held-out evaluation and other no-grad passes)."""
        return max(1, optim.batch_size // (self.ranks.world * optim.gradient_accumulation_steps))

    def eval_due(self, step: int, eval_steps: int) -> bool:
        """Evaluate every ``eval_steps`` steps (0: only at the last step; -1: never) and at the last step."""
        if eval_steps < 0:
            return False
        return bool(eval_steps and step % eval_steps == 0) or step == self.total_steps

    def log_due(self, step: int, run: RunArgs, metrics: dict) -> bool:
        """Log every --logging-steps, at the last step, and whenever a step has held-out or gold metrics."""
        evaluated = any(k.startswith("eval/") or k == "reward/gold" for k in metrics)
        return bool(metrics) and (step % run.logging_steps == 0 or step == self.total_steps or evaluated)

    def save_due(self, step: int, run: RunArgs) -> bool:
        """Checkpoint every --save-steps (0: never)."""
        return bool(run.save_steps) and step % run.save_steps == 0

    def end_step(self, step: int, run: RunArgs, metrics: dict, trainables: Trainables) -> None:
        """Log and checkpoint when due, advance the progress bar; stop here on SIGTERM/SIGINT."""
        if self.log_due(step, run, metrics):
            self.logger.log(step, metrics)
        models, optimizer = {"model": trainables.model}, trainables.optimizer
        if self.save_due(step, run):
            self.save(step, models, trainables.state_dict(), optimizer)
        self.logger.advance()
        self.stop_if_requested(step, models, trainables.state_dict(), optimizer)

    def close(self) -> None:
        self.stop.__exit__()
        self.logger.close()

    def finish(self, model, tokenizer, prefix: str = "", close: bool = True) -> None:
        """The final model in Hugging Face format (LoRA: merged, the adapter under adapter/; with
        ``--save-merged false`` the adapter alone), written by
        the main process once every process is done, with one line saying where; then close the logger.
        Under a sharding engine the full weights are gathered first (every process takes part); ``prefix``
        then selects the saved model's weights within ``model``'s (e.g. ``"policy."`` of an actor-critic)."""
        self.accelerator.wait_for_everyone()
        # under a sharding engine every process takes part in gathering; the main one writes
        full = engines.full_state_dict(self.accelerator, model) if engines.sharded(self.accelerator) else None
        if self.is_main:
            target = self.accelerator.unwrap_model(model)
            for part in filter(None, prefix.rstrip(".").split(".")):
                target = getattr(target, part)
            weights = None if full is None else {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
            save_pretrained(target, tokenizer, self.output_dir, state_dict=weights, merged=self.save_merged)
            logger.info("model saved to %s", self.output_dir.resolve())
        self.accelerator.wait_for_everyone()
        if close:
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
    if optim_args.gradient_checkpointing:
        updates.enable_gradient_checkpointing(model)
    optimizer = updates.build_optimizer(model, optim_args)
    scheduler = updates.build_scheduler(optimizer, optim_args, updates.schedule_length(optim_args, session.total_steps))
    model, optimizer = session.accelerator.prepare(model, optimizer)
    trainables = Trainables(model, optimizer, scheduler, IndexStream(n_rows, seed))
    if session.start_step > 0:  # only --resume sets a start step
        state = session.restore({"model": model}, optimizer)
        if "optimizer" in state:  # a sharding engine restored it with the model
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        trainables.stream.load_state_dict(state["stream"])
    elif optim_args.optimizer_state:
        updates.carry_in(session.accelerator, optimizer, scheduler, optim_args.optimizer_state)
    return trainables


# What a training run writes into its --output-dir: a folder holding any of these holds a run.
RUN_FILES = ("metrics.jsonl", "checkpoints", "config.yaml", "model.safetensors", "adapter_config.json")


def run_files(out: Path) -> list[str]:
    """The files in ``out`` that show a run was written there (empty for a missing, empty or other folder)."""
    if not out.is_dir():
        return []
    found = [name for name in RUN_FILES if (out / name).exists()]
    return found + sorted(f.name for f in out.glob("model-*.safetensors"))[:1]  # a sharded model's first file


def check_output_dir(run) -> None:
    """Stop when ``--output-dir`` holds another run, unless ``--resume`` continues it or
    ``--overwrite-output-dir`` replaces it (``run``: a RunArgs, or anything with those three fields)."""
    out = Path(run.output_dir)
    found = run_files(out)
    if found and not run.resume and not run.overwrite_output_dir:
        raise UserError(
            f"{out}: {option('output_dir')} holds another run ({', '.join(found[:3])}); give "
            f"{option('overwrite_output_dir', True)} to replace it, {option('resume', True)} to continue it, or "
            "another folder"
        )


def clear_output_dir(config, out: Path) -> None:
    """Empty ``out`` for ``--overwrite-output-dir``, keeping what this run reads from it (data written there by
    the Python API under inputs/, a model inside it)."""
    root = out.resolve()
    options = {k: v for k, v in flat_dict(config).items() if k != "output_dir"}
    values = [v for value in options.values() for v in (value if isinstance(value, list) else [value])]
    kept = set()
    for value in values:
        if not isinstance(value, str) or not value:
            continue
        path = Path(value).resolve()
        if path == root:
            raise UserError(f"{out}: {option('overwrite_output_dir', True)} would delete this run's own input {value}")
        if root in path.parents:
            kept.add(path.relative_to(root).parts[0])
    for entry in out.iterdir():
        if entry.name in kept:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def open_session(config, run: RunArgs, total_steps: int, desc: str) -> Session:
    """Seed, create the output dir (stopping when it holds another run; ``--overwrite-output-dir`` empties it
    first), write ``config.yaml``, find the resume point if ``--resume``, and start the --report-to trackers with
    the run's options."""
    out = Path(run.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: {option('output_dir')} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create {option('output_dir')} ({exc.strerror})") from None
    accelerator = make_accelerator(run)
    ranks = ranks_of(accelerator)
    check_output_dir(run)
    replace = bool(run_files(out)) and run.overwrite_output_dir and not run.resume
    accelerator.wait_for_everyone()  # every process looked before the main one writes anything
    if replace:
        if ranks.is_main:
            clear_output_dir(config, out)
        accelerator.wait_for_everyone()
    seed_everything(run.seed + ranks.rank)  # each process samples differently; rank 0 as a single process
    checkpointer = Checkpointer(out, run.save_total_limit, warn=_main_only(ranks, logger.warning))
    start, path = 0, None
    if run.resume:
        path = checkpointer.resume_point(ranks.world)
        start = int(path.name.split("-")[1])
        if ranks.is_main:
            logger.info("resuming from %s (step %d of %d)", path.resolve(), start, total_steps)
    if ranks.is_main:
        save_config(config, out)
    trackers.start(accelerator, run, described_options(config))
    metrics = MetricsLogger(
        out, total_steps, start, enabled=ranks.is_main, progress=run.progress, desc=desc, accelerator=accelerator
    )
    lora = getattr(config, "lora", None)
    save_merged = getattr(lora, "save_merged", True)
    stop = StopSignal().__enter__()
    return Session(accelerator, metrics, checkpointer, out, start, total_steps, stop, path, save_merged)


def _main_only(ranks: Ranks, fn):
    return fn if ranks.is_main else (lambda *args: None)
