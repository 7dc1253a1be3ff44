"""`rlhfkit sft`: supervised fine-tuning with the loss on completion / assistant tokens only.

Per step: take batch_size x accumulation rows, backward each micro-batch with
``token-loss sum / completion tokens in the whole step`` (so accumulation gives exactly the loss of
one big batch), clip, step. EOS is appended to every completion so the model learns to stop.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlhfkit.data.collate import collate_sft
from rlhfkit.data.encode import IGNORE_INDEX, encode_sft
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError
from rlhfkit.models.forward import next_token_logits
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import apply_lora
from rlhfkit.training import optim as opt
from rlhfkit.training.batches import chunks, step_indices
from rlhfkit.training.session import open_session, prepare_trainables


def token_loss_sum(model, batch: dict, pack_rows: bool = False) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross-entropy over labelled tokens, and their count (``pack_rows``: see
    ``next_token_logits``)."""
    logits = next_token_logits(model, batch["input_ids"], batch["attention_mask"], pack_rows)  # [B, L-1, V]
    labels = batch["labels"][:, 1:]  # position t predicts token t + 1
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, int((labels != IGNORE_INDEX).sum())


def encode_all(tokenizer, examples, data_args, path: str) -> list:
    from jinja2 import TemplateError

    items = []
    for i, ex in enumerate(examples):
        try:
            items.append(encode_sft(tokenizer, ex, data_args.max_length, data_args.max_prompt_length))
        except (ValueError, TemplateError) as exc:  # the tokenizer's chat template rejects this conversation
            raise UserError(f"{path}: row {i + 1}: field 'messages': {exc}") from None
    for i, (_, labels) in enumerate(items):
        if all(label == IGNORE_INDEX for label in labels[1:]):
            raise UserError(f"{path}: row {i + 1}: no completion tokens left after truncation to --max-length {data_args.max_length}")
    return items


@torch.no_grad()
def evaluate(model, items, pad_id: int, batch_size: int, device, pack_rows: bool = False) -> float:
    model.eval()
    total, count = 0.0, 0
    for chunk in chunks(items, batch_size):
        batch = {k: v.to(device) for k, v in collate_sft(chunk, pad_id).items()}
        loss, n = token_loss_sum(model, batch, pack_rows)
        total, count = total + float(loss), count + n
    model.train()
    return total / max(count, 1)


def train(cfg) -> dict:
    # 1. Validate every row before anything heavy happens.
    train_examples = load_examples(cfg.data.data, "sft", "rlhfkit sft")
    eval_examples = load_examples(cfg.data.eval_data, "sft", "rlhfkit sft") if cfg.data.eval_data else []

    # 2. Model, tokenizer, encoded data.
    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    model = load_causal_lm(cfg.model.model, cfg.model.trust_remote_code, tokenizer)
    if cfg.lora.lora_r > 0:
        model = apply_lora(model, cfg.lora)
    train_items = encode_all(tokenizer, train_examples, cfg.data, cfg.data.data)
    eval_items = encode_all(tokenizer, eval_examples, cfg.data, cfg.data.eval_data) if eval_examples else []

    # 3. Session: accelerator, optimizer, schedule, resume.
    rows_per_step = cfg.optim.batch_size * cfg.optim.gradient_accumulation_steps
    steps = opt.total_steps(cfg.optim, len(train_items), rows_per_step)
    session = open_session(cfg, cfg.run, steps, desc="sft")
    acc = session.accelerator
    t = prepare_trainables(session, model, cfg.optim, len(train_items), cfg.run.seed)
    model, optimizer, scheduler, stream = t.model, t.optimizer, t.scheduler, t.stream
    pad_id = tokenizer.pad_token_id
    model.train()

    # 4. The loop.
    metrics: dict[str, float] = {}
    for step in range(session.start_step + 1, steps + 1):
        micro = [collate_sft([train_items[i] for i in idx], pad_id) for idx in step_indices(stream, cfg.optim, acc)]
        micro = [{k: v.to(session.device) for k, v in b.items()} for b in micro]
        local_tokens = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in micro)
        step_tokens = float(acc.reduce(torch.tensor(float(local_tokens), device=session.device), "sum"))

        def loss_fn(batch):
            loss_sum, _ = token_loss_sum(model, batch, cfg.packing.pack_sequences)
            # DDP averages gradients over processes; scale so the result is the global token mean.
            loss = loss_sum * acc.num_processes / step_tokens
            return loss, {"loss": float(loss_sum.detach()) / step_tokens}

        stats = opt.accumulate(acc, model, micro, loss_fn)
        lr = scheduler.get_last_lr()[0]
        grad_norm = opt.step(acc, model, optimizer, scheduler, cfg.optim.max_grad_norm)
        if not math.isfinite(stats["loss"]):
            raise FloatingPointError(f"sft: the loss became {stats['loss']} at step {step}")
        metrics = {"loss": stats["loss"], "learning_rate": lr, "grad_norm": grad_norm, "epoch": stream.epoch}
        if eval_items and session.eval_due(step, cfg.run.eval_steps):
            metrics["eval/loss"] = evaluate(model, eval_items, pad_id, cfg.optim.batch_size, session.device,
                                            cfg.packing.pack_sequences)
        session.end_step(step, cfg.run, metrics, t)

    # 5. Final model in Hugging Face format.
    session.finish(model, tokenizer)
    return metrics
