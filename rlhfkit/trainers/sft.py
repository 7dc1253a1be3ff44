"""`rlhfkit sft`: supervised fine-tuning with the loss on completion / assistant tokens only.

The loss is the mean next-token cross-entropy over the step's completion tokens (the shared loop in
``rlhfkit.training.loop`` divides the token-loss sum by the completion tokens of the whole step, so
accumulation gives exactly the loss of one big batch). EOS is appended to every completion so the model
learns to stop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhfkit.config.commands import SFTConfig
from rlhfkit.data.collate import chunks, collate_sft
from rlhfkit.data.encode import IGNORE_INDEX, encode_sft_counted
from rlhfkit.data.lengths import report_rows
from rlhfkit.data.readers import row_location
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError, option
from rlhfkit.models.forward import labelled_logprobs, next_token_logits
from rlhfkit.models.loading import load_causal_lm, load_tokenizer, position_limit
from rlhfkit.models.lora import apply_lora
from rlhfkit.training.loop import Objective, fit
from rlhfkit.training.runtime import seed_everything
from rlhfkit.training.session import Session


def token_loss_sum(model, batch: dict) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross-entropy over labelled tokens, and their count. Where ``labelled_logprobs`` gives
    the labelled tokens' log-probs without the logits, the loss is minus their sum, the same number."""
    labelled = batch["labels"][:, 1:] != IGNORE_INDEX
    logprobs = labelled_logprobs(model, batch["input_ids"], batch["attention_mask"], labelled)
    if logprobs is not None:
        return -logprobs.sum(), int(labelled.sum())
    logits = next_token_logits(model, batch["input_ids"], batch["attention_mask"])  # [B, L-1, V]
    labels = batch["labels"][:, 1:]  # position t predicts token t + 1
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, int((labels != IGNORE_INDEX).sum())


def encode_all(tokenizer, examples, data_args, path: str, model: str = "") -> list:
    """Each row's ``(input_ids, labels)``; the rows cut to fit --max-length are counted in a note, and a row
    longer than ``model``'s positions (when given) stops the run (``rlhfkit.data.lengths.report_rows``)."""
    from jinja2 import TemplateError

    items, full = [], []
    for i, ex in enumerate(examples):
        try:
            ids, labels, length = encode_sft_counted(tokenizer, ex, data_args.max_length, data_args.max_prompt_length)
        except (ValueError, TemplateError) as exc:  # the tokenizer's chat template rejects this conversation
            raise UserError(f"{row_location(path, i)}: field 'messages': {exc}") from None
        items.append((ids, labels))
        full.append(length)
    for i, (_, labels) in enumerate(items):
        if all(label == IGNORE_INDEX for label in labels[1:]):
            raise UserError(
                f"{row_location(path, i)}: {full[i]} tokens, no completion tokens left after truncation to "
                f"{option('max_length', data_args.max_length)}"
            )
    if model:
        report_rows(full, [len(ids) for ids, _ in items], path, data_args, model, position_limit(model))
    return items


@torch.no_grad()
def evaluate(model, items, pad_id: int, batch_size: int, device) -> float:
    model.eval()
    total, count = 0.0, 0
    for chunk in chunks(items, batch_size):
        batch = {k: v.to(device) for k, v in collate_sft(chunk, pad_id).items()}
        loss, n = token_loss_sum(model, batch)
        total, count = total + float(loss), count + n
    model.train()
    return total / max(count, 1)


def train(cfg: SFTConfig) -> dict:
    # 1. Validate every row before anything heavy happens.
    train_examples = load_examples(cfg.data.data, "sft", "rlhfkit sft")
    eval_examples = load_examples(cfg.data.eval_data, "sft", "rlhfkit sft") if cfg.data.eval_data else []
    eval_examples = eval_examples if cfg.run.evaluates() else []  # --eval-steps -1: checked, not evaluated

    # 2. Model, tokenizer, encoded data.
    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    train_items = encode_all(tokenizer, train_examples, cfg.data, cfg.data.data, cfg.model.model)
    eval_items = encode_all(tokenizer, eval_examples, cfg.data, cfg.data.eval_data, cfg.model.model)
    model = load_causal_lm(cfg.model.model, cfg.model.trust_remote_code, tokenizer)
    if cfg.lora.lora_r > 0:
        seed_everything(cfg.run.seed)  # the adapters' initialisation: the same run for the same seed
        model = apply_lora(model, cfg.lora)
    pad_id = tokenizer.pad_token_id

    # 3. The batch and the loss; the shared loop does the rest.
    def objective(session: Session, _trainables) -> Objective:
        def collate(rows: list[int]) -> dict:
            return {k: v.to(session.device) for k, v in collate_sft([train_items[i] for i in rows], pad_id).items()}

        def loss(model, batch: dict):
            loss_sum, _ = token_loss_sum(model, batch)
            return loss_sum, {"loss": float(loss_sum.detach())}

        def held_out(model) -> dict[str, float]:
            return {
                "eval/loss": evaluate(model, eval_items, pad_id, session.micro_batch_size(cfg.optim), session.device)
            }

        return Objective(collate, units=completion_tokens, loss=loss, evaluate=held_out if eval_items else None)

    return fit(cfg, model, tokenizer, len(train_items), "sft", objective)


def completion_tokens(batch: dict) -> int:
    """The labelled (completion) tokens of a micro-batch: SFT's loss is their mean over the step."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
