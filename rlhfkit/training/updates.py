"""AdamW, the warm-up + decay schedule, one optimizer step with accumulation and clipping, and both continued from an
earlier run (``--optimizer-state``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from rlhfkit.errors import UserError, option
from rlhfkit.training import engines
from rlhfkit.training.checkpoint import STATE_FILE, Checkpointer


def enable_gradient_checkpointing(*models: torch.nn.Module | None) -> None:
    """``--gradient-checkpointing``: each Hugging Face model's layers recompute their activations in the backward
    pass (the non-reentrant form, which needs no input that requires grad, so LoRA and frozen embeddings work).
    PEFT wrappers and value backbones are reached through their base model."""
    for model in filter(None, models):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if not getattr(base, "supports_gradient_checkpointing", False):
            raise UserError(f"{option('gradient_checkpointing')}: {type(base).__name__} does not support it")
        enable = getattr(base, "activation_checkpointing_enable", None)  # the name from transformers 5.24 on
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def build_optimizer(model: torch.nn.Module, optim) -> torch.optim.Optimizer:
    """AdamW over trainable parameters; no weight decay on biases and norm weights (1-D tensors)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    # The fused kernel does the whole update in one call instead of ~10 small ops per tensor (the
    # same AdamW formula); with hundreds of small tensors that per-op overhead dominated on CPU.
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    try:
        return torch.optim.AdamW(groups, lr=optim.learning_rate, fused=fused or None)
    except (RuntimeError, TypeError, ValueError):  # an older torch without fused AdamW on this device
        return torch.optim.AdamW(groups, lr=optim.learning_rate)


def build_scheduler(optimizer: torch.optim.Optimizer, optim, total_steps: int):
    """Linear warm-up from 0 over ``warmup_steps``, then linear/cosine decay to 0, or constant."""
    warmup = optim.warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if optim.lr_scheduler == "constant":
            return 1.0
        progress = min((step - warmup) / max(total_steps - warmup, 1), 1.0)
        if optim.lr_scheduler == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def schedule_length(optim, steps: int) -> int:
    """The schedule's length in steps: --schedule-steps, else the run's own ``steps``."""
    return optim.schedule_steps or steps


def state_file(path: str | Path) -> Path:
    """The trainer-state file behind ``--optimizer-state PATH``: the file itself, a checkpoint folder's, or the
    newest complete checkpoint's of a run folder."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / STATE_FILE).is_file():
        return path / STATE_FILE
    latest = Checkpointer(path).latest()
    if latest is None:
        raise UserError(
            f"{path}: {option('optimizer_state')} names no {STATE_FILE}, checkpoint folder or run folder with a "
            "complete checkpoint"
        )
    return latest / STATE_FILE


def carry_in(accelerator, optimizer, scheduler, path: str | Path) -> int:
    """``--optimizer-state``: ``optimizer`` starts from the moments an earlier run of the same parameters saved,
    ``scheduler`` from that run's position; this run's own hyperparameters (learning rate, weight decay) stay.
    Returns the schedule's position (optimizer updates made before this run)."""
    if engines.engine(accelerator) not in ("single", "ddp"):
        raise UserError(f"{option('optimizer_state')} works with one process or DDP, not {engines.engine(accelerator)}")
    file = state_file(path)
    state = torch.load(file, weights_only=True, map_location="cpu")
    if "optimizer" not in state or "scheduler" not in state:
        raise UserError(f"{file}: holds no optimizer state (a sharded run's checkpoint keeps it in its shards)")
    saved = state["optimizer"]
    groups = optimizer.param_groups
    sizes, saved_sizes = [len(g["params"]) for g in groups], [len(g["params"]) for g in saved["param_groups"]]
    params = [p for g in groups for p in g["params"]]
    shapes = {i: tuple(v["exp_avg"].shape) for i, v in saved["state"].items() if "exp_avg" in v}
    wrong = [i for i, shape in shapes.items() if i >= len(params) or tuple(params[i].shape) != shape]
    if sizes != saved_sizes or wrong:
        raise UserError(
            f"{file}: its optimizer trained other parameters ({sum(saved_sizes)} tensors in groups of {saved_sizes}"
            f" against this run's {sum(sizes)} in {sizes}): {option('optimizer_state')} needs the same model, "
            f"{option('lora_r')} and trainable parts"
        )
    own = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    optimizer.load_state_dict(saved)
    for group, settings in zip(optimizer.param_groups, own):
        group.update(settings)
    position = int(state["scheduler"]["last_epoch"])
    scheduler.last_epoch = position
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(position)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]  # what get_last_lr() reports until the next step
    return position


def total_steps(optim, rows: int, rows_per_step: int) -> int:
    if optim.max_steps > 0:
        return optim.max_steps
    return max(1, math.ceil(optim.num_epochs * rows / rows_per_step))


def check_engine(accelerator, optim) -> None:
    """DeepSpeed counts micro-batches itself: its config must agree with --gradient-accumulation-steps."""
    if engines.engine(accelerator) != "deepspeed":
        return
    configured = accelerator.state.deepspeed_plugin.deepspeed_config.get("gradient_accumulation_steps", "auto")
    if configured not in ("auto", optim.gradient_accumulation_steps):
        raise UserError(
            f"the DeepSpeed config has gradient_accumulation_steps {configured} but "
            f"{option('gradient_accumulation_steps')} is {optim.gradient_accumulation_steps}: set them to the same "
            "value"
        )


def accumulate(accelerator, model, micro_batches: Iterable, loss_fn: Callable) -> dict[str, float]:
    """Backward over micro-batches; ``loss_fn(batch)`` returns (loss, stats) already scaled so that the
    sum over micro-batches is the loss of the whole step (e.g. token sum / tokens in the whole step).

    Gradient sync across processes happens only on the last micro-batch.
    """
    batches = list(micro_batches)
    totals: dict[str, float] = {}
    deepspeed = engines.engine(accelerator) == "deepspeed"
    for i, batch in enumerate(batches):
        if deepspeed:  # its engine steps inside backward, at the micro-batch that ends the step
            accelerator.gradient_state._set_sync_gradients(i == len(batches) - 1)
        ctx = accelerator.no_sync(model) if i < len(batches) - 1 else contextlib.nullcontext()
        with ctx, accelerator.autocast():
            loss, stats = loss_fn(batch)
            accelerator.backward(loss)
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    if not grads:
        return torch.zeros(())
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))


def step(accelerator, model, optimizer, scheduler, max_grad_norm: float) -> float:
    """Clip, step, schedule, zero grads; returns the gradient norm before clipping."""
    params = [p for p in model.parameters() if p.requires_grad]
    if max_grad_norm > 0:
        norm = accelerator.clip_grad_norm_(params, max_grad_norm)
    else:  # only for logging; one batched call rather than a norm per tensor
        norm = _total_norm([p.grad for p in params if p.grad is not None])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
