"""The one offline training loop, shared by `sft`, `rm` and `dpo`.

A command validates its rows, loads its model, and hands ``fit`` an ``Objective``: how to turn row indices
into a micro-batch, how many loss units a micro-batch holds (completion tokens for SFT, pairs for RM and
DPO), and its loss summed over those units. ``fit`` owns everything else, the same way for every command:

  1. session: output dir, config.yaml, accelerator, logger, checkpoints (``open_session``)
  2. AdamW + schedule + data stream, restored from the newest checkpoint on ``--resume``
  3. per step: take --batch-size rows, this process's share of them in --gradient-accumulation-steps
     micro-batches, backward each micro-batch with
     ``loss sum x processes / units in the whole step`` (so accumulation and data parallelism give exactly
     the mean over one big batch), clip, step; stop on a non-finite loss
  4. evaluate every ``--eval-steps`` and at the end; log every ``--logging-steps``; checkpoint every
     ``--save-steps``; with ``--patience``, stop once that many evaluations in a row have not lowered the
     held-out loss
  5. with ``--keep-best``, put back the trainable weights of the evaluation with the lowest held-out loss;
     then the final model in Hugging Face format (or the command's own ``finish``)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfkit.errors import option
from rlhfkit.training import updates
from rlhfkit.training.batches import step_indices
from rlhfkit.training.distributed import Ranks, per_rank
from rlhfkit.training.session import Session, Trainables, open_session, prepare_trainables

Batch = Any
logger = logging.getLogger(__name__)


@dataclass
class Objective:
    """What a command supplies to ``fit``.

    collate:  row indices -> a micro-batch on the session's device
    units:    a micro-batch -> how many loss units it holds (tokens or pairs)
    loss:     (model, micro-batch) -> (loss summed over its units, metric sums over its units); the loop
              divides both by the units of the whole step
    evaluate: model -> held-out metrics (``eval/...``), or None without eval data
    derived:  step metrics -> metrics computed from them (e.g. a margin from two means)
    """

    collate: Callable[[list[int]], Batch]
    units: Callable[[Batch], float]
    loss: Callable[[torch.nn.Module, Batch], tuple[torch.Tensor, dict[str, float]]]
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None
    derived: Callable[[dict[str, float]], dict[str, float]] = field(default=lambda metrics: {})


def fit(
    cfg,
    model: torch.nn.Module,
    tokenizer,
    n_rows: int,
    name: str,
    objective: Callable[[Session, Trainables], Objective],
    finish: Callable[[Session, Trainables], None] | None = None,
) -> dict[str, float]:
    """Train ``model`` on ``n_rows`` rows as configured by ``cfg`` (a command config with ``optim`` and
    ``run`` parts); ``objective`` is built once the session and the prepared model exist. Returns the last
    step's metrics."""
    total = updates.total_steps(cfg.optim, n_rows, cfg.optim.batch_size)
    session = open_session(cfg, cfg.run, total, desc=name)
    check_split(cfg.optim, session.ranks)
    updates.check_engine(session.accelerator, cfg.optim)
    trainables = prepare_trainables(session, model, cfg.optim, n_rows, cfg.run.seed)
    task = objective(session, trainables)
    trainables.model.train()
    metrics: dict[str, float] = {}
    best = BestWeights(getattr(cfg, "stopping", None))
    for step in range(session.start_step + 1, total + 1):
        metrics = train_step(cfg, session, trainables, task, name, step)
        stop = False
        if task.evaluate is not None and session.eval_due(step, cfg.run.eval_steps):
            metrics.update(task.evaluate(trainables.model))
            stop = best.update(step, metrics["eval/loss"], trainables.model)
        session.end_step(step, cfg.run, metrics, trainables)
        if stop:
            logger.info(
                "%s: held-out loss not lowered in %d evaluations: stopped at step %d", name, best.patience, step
            )
            break
    best.restore(trainables.model, name)
    if finish is None:
        session.finish(trainables.model, tokenizer)
    else:
        finish(session, trainables)
    return metrics


class BestWeights:
    """``--keep-best`` and ``--patience``: follows the held-out loss of each evaluation, keeps a copy of the
    trainable weights (LoRA: the adapters and the new head; in full: every weight) at the lowest one, and says
    when to stop. Inactive without a ``stopping`` config part or with both options off."""

    def __init__(self, stopping=None):
        self.keep = bool(stopping is not None and stopping.keep_best)
        self.patience = stopping.patience if stopping is not None else 0
        self.best_loss = math.inf
        self.best_step = 0
        self.since_best = 0
        self.weights: dict[str, torch.Tensor] = {}

    def update(self, step: int, loss: float, model: torch.nn.Module) -> bool:
        """Record the evaluation of ``step``; True when training should stop."""
        if loss < self.best_loss:
            self.best_loss, self.best_step, self.since_best = loss, step, 0
            if self.keep:
                with torch.no_grad():
                    self.weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        else:
            self.since_best += 1
        return bool(self.patience) and self.since_best >= self.patience

    def restore(self, model: torch.nn.Module, name: str) -> None:
        if not (self.keep and self.weights):
            return
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in self.weights:
                    p.copy_(self.weights[n])
        logger.info("%s: kept the weights of step %d (held-out loss %.4f)", name, self.best_step, self.best_loss)


def check_split(optim, ranks: Ranks) -> None:
    """--batch-size must split into equal micro-batches on every process."""
    per_rank(
        optim.batch_size,
        ranks.world,
        what=option("batch_size"),
        unit=optim.gradient_accumulation_steps,
        unit_what=option("gradient_accumulation_steps"),
    )


def train_step(cfg, session: Session, trainables: Trainables, task: Objective, name: str, step: int) -> dict:
    """One optimizer step over this process's micro-batches; returns the step's metrics (global means)."""
    started = time.perf_counter()
    accelerator, model = session.accelerator, trainables.model
    micro = [task.collate(rows) for rows in step_indices(trainables.stream, cfg.optim, session.ranks)]
    local_units = torch.tensor(float(sum(task.units(b) for b in micro)), device=session.device)
    step_units = float(accelerator.reduce(local_units, "sum"))

    def loss_fn(batch):
        loss_sum, sums = task.loss(model, batch)
        # DDP averages gradients over processes; scale so the result is the mean over the global step.
        return loss_sum * accelerator.num_processes / step_units, sums

    sums = updates.accumulate(accelerator, model, micro, loss_fn)
    keys = list(sums)  # the same order on every process
    totals = accelerator.reduce(torch.tensor([sums[k] for k in keys], device=session.device), "sum")
    stats = {k: float(v) / step_units for k, v in zip(keys, totals)}
    learning_rate = trainables.scheduler.get_last_lr()[0]
    grad_norm = updates.step(accelerator, model, trainables.optimizer, trainables.scheduler, cfg.optim.max_grad_norm)
    if not math.isfinite(stats["loss"]):
        raise FloatingPointError(f"{name}: the loss became {stats['loss']} at step {step}")
    return {
        **stats,
        **task.derived(stats),
        "learning_rate": learning_rate,
        "grad_norm": grad_norm,
        "epoch": trainables.stream.epoch,
        "time/step_s": time.perf_counter() - started,
    }
