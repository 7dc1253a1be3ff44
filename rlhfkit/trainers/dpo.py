"""`rlhfkit dpo`: direct preference optimisation (Rafailov et al. 2023), IPO (Azar et al. 2023) and
conservative DPO (label smoothing).

Per step: take batch_size x accumulation preference pairs. For each micro-batch of B pairs, ONE
forward pass of the policy over ``[chosen rows; rejected rows]`` (``[2B, L]``, see
``collate_preferences``) gives log pi(y|x) summed over response tokens; the frozen reference gives
log pi_ref(y|x) (``--ref-model``, or a copy of the starting model, or with LoRA the same backbone with its
adapters off);
``ops.dpo_loss`` turns the four into per-pair losses. The step's loss is the mean over all its pairs
(``rlhfkit.training.loop``), so accumulation gives exactly the loss of one big batch.

The reference never changes, so its log-probs can be computed once per pair (``--precompute-ref``): with
full fine-tuning all before training, which frees the reference copy; with LoRA each the first time its pair
is drawn (the reference is the policy's own backbone, so there is no copy to free, and a run shorter than an
epoch computes no pair it never trains on). For held-out pairs they are always computed before training.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from rlhfkit.config.commands import DPOConfig
from rlhfkit.data.collate import SequenceBatch, chunks, collate_preferences
from rlhfkit.data.encode import Encoded, encode_preference
from rlhfkit.data.lengths import report_pair_rows
from rlhfkit.data.schema import load_examples
from rlhfkit.models.forward import sequence_logprobs
from rlhfkit.models.loading import load_causal_lm, load_tokenizer, position_limit
from rlhfkit.models.lora import adapter_on, adapters_off, apply_lora, continue_lora
from rlhfkit.ops import dpo_loss
from rlhfkit.training.loop import Objective, fit
from rlhfkit.training.runtime import disable_dropout, seed_everything
from rlhfkit.training.session import Session, Trainables

Pair = tuple[Encoded, Encoded]  # (chosen, rejected) with the same prompt ids
METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margin",
    "rewards/accuracy",
    "logps/chosen",
    "logps/rejected",
)


@dataclass
class PairBatch:
    """A micro-batch of B preference pairs.

    rows: [B]      indices of the pairs in their data set (to look up precomputed reference log-probs)
    seqs: [2B, L]  the B chosen prompt + response rows, then the B rejected ones
    """

    rows: torch.Tensor
    seqs: SequenceBatch


def make_batch(pairs: list[Pair], rows: list[int], pad_id: int, device) -> PairBatch:
    return PairBatch(
        torch.tensor(rows, dtype=torch.long), collate_preferences([pairs[i] for i in rows], pad_id).to(device)
    )


def split_pairs(logps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[2B]`` -> chosen ``[B]``, rejected ``[B]`` (``collate_preferences`` puts the chosen rows first)."""
    half = logps.shape[0] // 2
    return logps[:half], logps[half:]


class Reference:
    """log pi_ref of preference pairs, ``[2B]`` like the policy's.

    ``model`` is a frozen copy of the starting model, or for LoRA the policy itself, run with its
    adapters off (the backbone is frozen, so that is the starting model, without a second copy of
    the weights). ``precompute(split, ...)`` stores ``[N, 2]`` (chosen, rejected) per row of a data
    set; ``logps`` then looks rows up instead of running the model. ``cache(split, n)`` starts an empty table
    that ``logps`` fills as rows are first asked for.
    """

    def __init__(self, model: torch.nn.Module):
        self.model: torch.nn.Module | None = model
        self.tables: dict[str, torch.Tensor] = {}

    def release(self) -> None:
        """Drop the model once every split it will be asked about is precomputed (frees the frozen copy)."""
        self.model = None

    @torch.no_grad()
    def forward(self, seqs: SequenceBatch) -> torch.Tensor:
        assert self.model is not None, "the reference model was released after precomputing"
        with adapters_off(self.model):
            return sequence_logprobs(self.model, seqs)

    def precompute(
        self, split: str, pairs: list[Pair], pad_id: int, batch_size: int, device, autocast, report=None
    ) -> None:
        """Every row of ``pairs`` now; ``report(done, total)`` after each batch (a progress note)."""
        parts = []
        for rows in chunks(list(range(len(pairs))), batch_size):
            with autocast():
                chosen, rejected = split_pairs(self.forward(make_batch(pairs, rows, pad_id, device).seqs))
            parts.append(torch.stack([chosen, rejected], dim=1).float().cpu())  # [b, 2]
            if report is not None:
                report(rows[-1] + 1, len(pairs))
        self.tables[split] = torch.cat(parts)

    def cache(self, split: str, n: int) -> None:
        self.tables[split] = torch.full((n, 2), float("nan"))

    def logps(self, batch: PairBatch, split: str) -> torch.Tensor:
        table = self.tables.get(split)
        if table is None:
            return self.forward(batch.seqs)
        missing = torch.isnan(table[batch.rows, 0])
        if missing.any():  # rows drawn for the first time: one pass over the batch fills them in
            chosen, rejected = split_pairs(self.forward(batch.seqs))
            fresh = torch.stack([chosen, rejected], dim=1).float().cpu()
            table[batch.rows[missing]] = fresh[missing]
        looked_up = table[batch.rows].to(batch.seqs.input_ids.device)  # [B, 2]
        return torch.cat([looked_up[:, 0], looked_up[:, 1]])


def pair_losses(policy_logps: torch.Tensor, ref_logps: torch.Tensor, args) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-pair DPO losses ``[B]`` from ``[2B]`` policy and reference log-probs, and the batch's
    metric sums (divide by the number of pairs for means)."""
    chosen, rejected = split_pairs(policy_logps)
    ref_chosen, ref_rejected = split_pairs(ref_logps)
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        chosen, rejected, ref_chosen, ref_rejected, args.beta, args.loss_type, args.label_smoothing
    )
    sums = {
        "loss": losses.detach().sum(),
        "rewards/chosen": chosen_rewards.sum(),
        "rewards/rejected": rejected_rewards.sum(),
        "rewards/margin": (chosen_rewards - rejected_rewards).sum(),
        "rewards/accuracy": (chosen_rewards > rejected_rewards).float().sum(),
        "logps/chosen": chosen.detach().sum(),
        "logps/rejected": rejected.detach().sum(),
    }
    return losses, {k: float(v) for k, v in sums.items()}


def encode_all(tokenizer, examples, data_args, path: str = "", model: str = "") -> list[Pair]:
    """The pairs' ids; with ``path`` and ``model``, the rows cut to fit --max-length are counted in a note and
    one longer than the model's positions stops the run (``rlhfkit.data.lengths.report_pair_rows``)."""
    # encode_pair keeps at least one response token (EOS at worst), so every pair has something to compare.
    pairs = [encode_preference(tokenizer, ex, data_args.max_length, data_args.max_prompt_length) for ex in examples]
    if path and model:
        report_pair_rows(pairs, path, data_args, model, position_limit(model))
    return pairs


@torch.no_grad()
def evaluate(
    model,
    reference: Reference,
    pairs: list[Pair],
    pad_id: int,
    batch_size: int,
    args,
    device,
    autocast,
) -> dict[str, float]:
    model.eval()
    totals = dict.fromkeys(METRICS, 0.0)
    for rows in chunks(list(range(len(pairs))), batch_size):
        batch = make_batch(pairs, rows, pad_id, device)
        with autocast():
            _, sums = pair_losses(sequence_logprobs(model, batch.seqs), reference.logps(batch, "eval"), args)
        totals = {k: totals[k] + sums[k] for k in METRICS}
    model.train()
    return {f"eval/{k}": v / len(pairs) for k, v in totals.items()}


def train(cfg: DPOConfig) -> dict:
    # 1. Validate every row before anything heavy happens.
    train_examples = load_examples(cfg.data.data, "preference", "rlhfkit dpo")
    eval_examples = load_examples(cfg.data.eval_data, "preference", "rlhfkit dpo") if cfg.data.eval_data else []
    eval_examples = eval_examples if cfg.run.evaluates() else []  # --eval-steps -1: checked, not evaluated

    # 2. Policy, reference, tokenizer, encoded pairs. Dropout off: the loss compares log-probs of two models.
    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    train_pairs = encode_all(tokenizer, train_examples, cfg.data, cfg.data.data, cfg.model.model)
    eval_pairs = encode_all(tokenizer, eval_examples, cfg.data, cfg.data.eval_data, cfg.model.model)
    lora = cfg.lora.lora_r > 0
    # a LoRA adapter trained on --ref-model (a round of online DPO) trains on, the reference its adapters off
    continued = lora and bool(cfg.dpo.ref_model) and adapter_on(cfg.model.model, cfg.dpo.ref_model)
    model = load_causal_lm(cfg.dpo.ref_model if continued else cfg.model.model, cfg.model.trust_remote_code, tokenizer)
    disable_dropout(model)  # before LoRA, so an explicit --lora-dropout still applies to the adapters
    # the reference: --ref-model, else the starting policy (a frozen copy, or with LoRA the adapters off)
    frozen = []
    if continued:
        model = continue_lora(model, cfg.model.model)
    elif cfg.dpo.ref_model:
        reference_model = load_causal_lm(cfg.dpo.ref_model, cfg.model.trust_remote_code, tokenizer)
        disable_dropout(reference_model)
        frozen.append(reference_model.requires_grad_(False).eval())
    elif not lora:
        frozen.append(copy.deepcopy(model).requires_grad_(False).eval())
    if lora and not continued:
        seed_everything(cfg.run.seed)  # the adapters' initialisation: the same run for the same seed
        model = apply_lora(model, cfg.lora)
    pad_id = tokenizer.pad_token_id

    # 3. The reference, the batch and the loss; the shared loop does the rest.
    def objective(session: Session, trainables: Trainables) -> Objective:
        accelerator, device = session.accelerator, session.device
        rows = session.micro_batch_size(cfg.optim)
        policy = accelerator.unwrap_model(trainables.model)
        reference = Reference(frozen.pop().to(device) if frozen else policy)  # the only handle

        def report(split):
            return lambda done, n: session.logger.note(f"reference log-probs of {split} pairs: {done}/{n}")

        # Reference log-probs that are fixed for the whole run: held-out pairs always (they are scored at
        # every evaluation), training pairs with --precompute-ref (with LoRA as they are drawn). A resumed run
        # recomputes them; with several processes each computes every row it needs (the reference pass is a
        # fraction of one epoch's work).
        if eval_pairs:
            reference.precompute("eval", eval_pairs, pad_id, rows, device, accelerator.autocast, report("held-out"))
        if cfg.dpo.precompute_ref and lora and not cfg.dpo.ref_model:
            reference.cache("train", len(train_pairs))
        elif cfg.dpo.precompute_ref:
            start = time.perf_counter()
            reference.precompute("train", train_pairs, pad_id, rows, device, accelerator.autocast, report("training"))
            session.logger.write(
                f"dpo: reference log-probs of {len(train_pairs)} pairs precomputed in "
                f"{time.perf_counter() - start:.1f}s"
            )
            reference.release()  # frees the reference copy
        session.logger.note("")

        def loss(model, batch: PairBatch):
            policy_logps = sequence_logprobs(model, batch.seqs)  # [2B]: chosen + rejected
            losses, sums = pair_losses(policy_logps, reference.logps(batch, "train"), cfg.dpo)
            return losses.sum(), sums

        def held_out(model) -> dict[str, float]:
            return evaluate(
                model,
                reference,
                eval_pairs,
                pad_id,
                rows,
                cfg.dpo,
                device,
                accelerator.autocast,
            )

        return Objective(
            lambda rows: make_batch(train_pairs, rows, pad_id, device),
            units=lambda batch: len(batch.rows),
            loss=loss,
            evaluate=held_out if eval_pairs else None,
        )

    return fit(cfg, model, tokenizer, len(train_pairs), "dpo", objective)
