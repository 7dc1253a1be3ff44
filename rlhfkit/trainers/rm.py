"""`rlhfkit rm`: a Bradley–Terry reward model from preference pairs (Ouyang et al. 2022).

Per step: take batch_size x accumulation pairs; each micro-batch puts its chosen and rejected rows
through ONE forward pass ([2B, L]), scores them at the last real token, and backpropagates

    (−log σ(s_c − s_r − margin) + center_coef·(s_c + s_r)²), summed over its pairs / pairs in the step

so accumulation gives exactly the loss of one big batch. Dropout is off: a pair's two scores and the
resumed run then match an uninterrupted one exactly.

``--ensemble K`` trains K independent reward models with seeds seed, seed+1, ...: member 0 in
``OUT`` itself, member i in ``OUT/member-i`` (each a full reward-model directory with its own
metrics.jsonl and checkpoints), listed in ``OUT/ensemble.json`` with the ensemble's statistics. With
``--weight-average`` the members share member 0's initialisation (seed i orders member i's data only), and
``OUT/average`` is their weight average (``rlhfkit.models.average``), one reward model with statistics of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from accelerate import PartialState

from rlhfkit.config.commands import RMConfig
from rlhfkit.data.collate import SequenceBatch, chunks, collate_preferences
from rlhfkit.data.encode import Encoded, encode_preference
from rlhfkit.data.lengths import report_pair_rows
from rlhfkit.data.schema import PreferenceExample, load_examples
from rlhfkit.files import write_json
from rlhfkit.models.average import weight_average
from rlhfkit.models.loading import load_tokenizer, position_limit
from rlhfkit.models.lora import apply_lora
from rlhfkit.models.reward import (
    ENSEMBLE_FILE,
    STATS_FILE,
    RewardScorer,
    build_reward_model,
    score_stats,
    sequence_scores,
)
from rlhfkit.ops import bradley_terry_loss
from rlhfkit.training import engines, trackers
from rlhfkit.training.checkpoint import Checkpointer
from rlhfkit.training.loop import Objective, fit
from rlhfkit.training.runtime import disable_dropout, pick_device, seed_everything
from rlhfkit.training.session import Session, Trainables

logger = logging.getLogger(__name__)
AVERAGE_DIR = "average"

# reward_stats.json (the score mean and std PPO normalises with) comes from at most this many training pairs
STATS_PAIRS = 500


@dataclass
class Pairs:
    """B encoded preference pairs and their margins (0 where a row gives none)."""

    chosen: list[Encoded]
    rejected: list[Encoded]
    margin: list[float]


@dataclass
class PairBatch:
    """seqs: [2B, L] chosen rows then rejected rows (right-padded); margin: [B]."""

    seqs: SequenceBatch
    margin: torch.Tensor

    @property
    def num_pairs(self) -> int:
        return self.margin.shape[0]


def encode_all(tokenizer, examples: list[PreferenceExample], data_args, path: str = "", model: str = "") -> Pairs:
    """The pairs' ids; with ``path`` and ``model``, the rows cut to fit --max-length are counted in a note and
    one longer than the model's positions stops the run (``rlhfkit.data.lengths.report_rows``)."""
    pairs = [encode_preference(tokenizer, ex, data_args.max_length, data_args.max_prompt_length) for ex in examples]
    if path and model:
        report_pair_rows(pairs, path, data_args, model, position_limit(model))
    return Pairs([c for c, _ in pairs], [r for _, r in pairs], [ex.margin or 0.0 for ex in examples])


def collate(pairs: Pairs, idx: list[int], pad_id: int) -> PairBatch:
    seqs = collate_preferences([(pairs.chosen[i], pairs.rejected[i]) for i in idx], pad_id)
    return PairBatch(seqs, torch.tensor([pairs.margin[i] for i in idx], dtype=torch.float32))


def preference_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Fraction of pairs ranked right (s_c > s_r); a tie counts one half."""
    return ((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean()


def preference_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None, center_coef: float
) -> torch.Tensor:
    """Mean over B pairs of −log σ(s_c − s_r − margin) + center_coef·(s_c + s_r)².

    The centering term (Eisenstein et al. 2023) pins the free offset of Bradley–Terry scores near 0.
    ``chosen``, ``rejected``, ``margin``: ``[B]``.
    """
    loss = bradley_terry_loss(chosen, rejected, margin)
    if center_coef:
        loss = loss + center_coef * ((chosen + rejected) ** 2).mean()
    return loss


def pair_scores(model, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B], [B])`` chosen and rejected scores from one forward pass over the [2B, L] batch."""
    return sequence_scores(model, batch.seqs).chunk(2)


@torch.no_grad()
def score_pairs(
    model, pairs: Pairs, pad_id: int, rows: int, device, idx: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([N], [N])`` chosen and rejected scores of the pairs ``idx`` (default: all), in that order, ``rows``
    sequences (rows // 2 pairs) per forward, batched by length. A pair's two replies go through the same
    forward, as in training (packed, their prompt is laid out once). Eval mode for the pass, then restored."""
    idx = list(range(len(pairs.chosen))) if idx is None else idx

    def length(i: int) -> int:
        c, r = pairs.chosen[i], pairs.rejected[i]
        return len(c.prompt_ids) + max(len(c.response_ids), len(r.response_ids))

    was_training = model.training
    model.eval()
    chosen, rejected = torch.empty(len(idx)), torch.empty(len(idx))
    for js in chunks(sorted(range(len(idx)), key=lambda j: length(idx[j])), max(1, rows // 2)):
        batch = collate(pairs, [idx[j] for j in js], pad_id)
        c, r = pair_scores(model, PairBatch(batch.seqs.to(device), batch.margin))
        chosen[js], rejected[js] = c.float().cpu(), r.float().cpu()
    model.train(was_training)
    return chosen, rejected


def stats_pairs(n: int) -> list[int]:
    """The training pairs whose scores give ``reward_stats.json``: all of them up to ``STATS_PAIRS``, else
    ``STATS_PAIRS`` of them drawn with a fixed seed (the same on every process)."""
    limit = STATS_PAIRS
    if n <= limit:
        return list(range(n))
    return sorted(torch.randperm(n, generator=torch.Generator().manual_seed(0))[:limit].tolist())


@torch.no_grad()
def evaluate(model, pairs: Pairs, pad_id: int, batch_size: int, device) -> dict[str, float]:
    chosen, rejected = score_pairs(model, pairs, pad_id, batch_size, device)
    margin = torch.tensor(pairs.margin)
    return {
        "eval/loss": float(bradley_terry_loss(chosen, rejected, margin)),
        "eval/accuracy": float(preference_accuracy(chosen, rejected)),
    }


def train(cfg: RMConfig) -> dict:
    # 1. Validate every row before anything heavy happens.
    train_examples = load_examples(cfg.data.data, "preference", "rlhfkit rm")
    eval_examples = load_examples(cfg.data.eval_data, "preference", "rlhfkit rm") if cfg.data.eval_data else []
    eval_examples = eval_examples if cfg.run.evaluates() else []  # --eval-steps -1: checked, not evaluated
    out = Path(cfg.run.output_dir)
    if out.is_dir():
        (out / ENSEMBLE_FILE).unlink(missing_ok=True)  # written last: its presence means a finished ensemble

    # 2. One reward model, or K members trained one after another and then their joint statistics.
    if cfg.reward.ensemble == 1:
        return train_one(cfg, train_examples, eval_examples)
    members = []
    for i in range(cfg.reward.ensemble):
        member_cfg = _member_config(cfg, i)
        members.append(Path(member_cfg.run.output_dir))
        if cfg.run.resume and (members[-1] / STATS_FILE).is_file():
            continue  # this member finished before the interruption
        # Weight averaging needs members in one basin: they share the initialisation and differ in data order.
        train_one(member_cfg, train_examples, eval_examples, cfg.run.seed if cfg.reward.weight_average else None)
    if not PartialState().is_main_process:
        return {}
    metrics = write_ensemble(cfg, members, train_examples, eval_examples)
    logger.info("reward-model ensemble (%d members) saved to %s", len(members), out.resolve())
    if cfg.reward.weight_average:
        logger.info("their weight average saved to %s", (out / AVERAGE_DIR).resolve())
    return metrics


def _member_config(cfg: RMConfig, i: int) -> RMConfig:
    """Member i: seed + i, in OUT (i = 0) or OUT/member-i, resuming only if it has a checkpoint; in the trackers
    the run RUN_NAME-member-i."""
    if i == 0:
        return cfg
    out = Path(cfg.run.output_dir) / f"member-{i}"
    resume = cfg.run.resume and Checkpointer(out).latest() is not None
    name = f"{trackers.run_name(cfg.run)}-member-{i}"
    # a member interrupted before its first checkpoint starts again in its own folder
    overwrite = cfg.run.overwrite_output_dir or (cfg.run.resume and not resume)
    run = replace(
        cfg.run,
        seed=cfg.run.seed + i,
        output_dir=str(out),
        resume=resume,
        run_name=name,
        overwrite_output_dir=overwrite,
    )
    return replace(cfg, run=run, reward=replace(cfg.reward, ensemble=1))


def train_one(
    cfg: RMConfig,
    train_examples: list[PreferenceExample],
    eval_examples: list[PreferenceExample],
    init_seed: int | None = None,
) -> dict:
    """Train one reward model into ``cfg.run.output_dir``; returns the last logged metrics. ``init_seed``: the
    seed of the new head's and the adapters' initialisation when it is not --seed (which orders the data)."""
    out = Path(cfg.run.output_dir)
    if out.is_dir():
        (out / STATS_FILE).unlink(missing_ok=True)  # written last: its presence means a finished model

    # 1. Model (the new head's initialisation depends on the seed), tokenizer, encoded pairs.
    seed_everything(cfg.run.seed if init_seed is None else init_seed)
    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    train_pairs = encode_all(tokenizer, train_examples, cfg.data, cfg.data.data, cfg.model.model)
    eval_pairs = encode_all(tokenizer, eval_examples, cfg.data, cfg.data.eval_data, cfg.model.model)
    eval_pairs = eval_pairs if eval_examples else None
    model = build_reward_model(cfg.model.model, tokenizer, cfg.model.trust_remote_code)
    disable_dropout(model)
    if cfg.lora.lora_r > 0:  # adapters on the backbone; the new score head trains in full beside them
        model = apply_lora(model, cfg.lora, task_type="SEQ_CLS")

    pad_id = tokenizer.pad_token_id

    # 2. The batch and the loss; the shared loop does the rest.
    def objective(session: Session, _trainables) -> Objective:
        def collate_rows(rows: list[int]) -> PairBatch:
            batch = collate(train_pairs, rows, pad_id)
            return PairBatch(batch.seqs.to(session.device), batch.margin.to(session.device))

        def loss(model, batch: PairBatch):
            chosen, rejected = pair_scores(model, batch)
            n = batch.num_pairs
            loss_sum = preference_loss(chosen, rejected, batch.margin, cfg.reward.center_coef) * n
            c, r = chosen.detach(), rejected.detach()
            return loss_sum, {
                "loss": float(loss_sum.detach()),
                "accuracy": float(preference_accuracy(c, r)) * n,
                "reward/chosen": float(c.sum()),
                "reward/rejected": float(r.sum()),
            }

        # A training micro-batch holds 2B rows with activations; scoring keeps none.
        score_rows = 2 * session.micro_batch_size(cfg.optim)

        def held_out(model) -> dict[str, float]:
            return evaluate(model, eval_pairs, pad_id, score_rows, session.device)

        return Objective(
            collate_rows,
            units=lambda batch: batch.num_pairs,
            loss=loss,
            evaluate=held_out if eval_pairs else None,
            derived=lambda m: {"reward/margin": m["reward/chosen"] - m["reward/rejected"]},
        )

    # 3. Final model in Hugging Face format, then the score statistics PPO normalises with (written
    #    last: their presence marks a finished model).
    def finish(session: Session, trainables: Trainables) -> None:
        # Every process scores (under a sharding engine each forward is a collective); the first writes.
        model = (
            trainables.model
            if engines.sharded(session.accelerator)
            else session.accelerator.unwrap_model(trainables.model)
        )
        rows = 2 * session.micro_batch_size(cfg.optim)
        picked = stats_pairs(len(train_pairs.chosen))
        scores = torch.cat(score_pairs(model, train_pairs, pad_id, rows, session.device, picked))
        session.finish(trainables.model, tokenizer, close=False)
        if session.is_main:
            stats = {
                **score_stats(scores),
                "max_length": cfg.data.max_length,
                "max_prompt_length": cfg.data.max_prompt_length,
            }
            write_json(session.output_dir / STATS_FILE, stats)
        session.close()

    return fit(cfg, model, tokenizer, len(train_examples), "rm", objective, finish)


def write_ensemble(
    cfg: RMConfig, members: list[Path], train_examples: list[PreferenceExample], eval_examples: list[PreferenceExample]
) -> dict:
    """Write ``OUT/ensemble.json``: members, seeds, conservative k, and the statistics of the ensemble
    mean over the training responses of the pairs ``stats_pairs`` picks (what PPO normalises), plus held-out
    accuracy when eval data is given."""
    root = Path(cfg.run.output_dir)
    names = [str(m.relative_to(root)) for m in members]
    info = {
        "members": names,
        "seeds": [cfg.run.seed + i for i in range(len(members))],
        "conservative_k": cfg.reward.conservative_k,
    }
    write_json(root / ENSEMBLE_FILE, info)  # a preliminary file so RewardScorer can load the ensemble
    device = pick_device(cfg.run.cpu)
    scorer = RewardScorer.load(str(root), device, cfg.model.trust_remote_code)
    rows = 2 * max(1, cfg.optim.batch_size // cfg.optim.gradient_accumulation_steps)
    picked = [train_examples[i] for i in stats_pairs(len(train_examples))]
    prompts = [ex.prompt for ex in picked]
    scores = torch.cat(
        [
            scorer.member_scores(prompts, [ex.chosen for ex in picked], rows),
            scorer.member_scores(prompts, [ex.rejected for ex in picked], rows),
        ],
        dim=1,
    )
    info["stats"] = score_stats(scores.mean(dim=0).cpu())
    metrics: dict[str, float] = {}
    average = write_average(cfg, members, picked, rows, device) if cfg.reward.weight_average else None
    if eval_examples:
        prompts = [ex.prompt for ex in eval_examples]
        chosen = scorer.member_scores(prompts, [ex.chosen for ex in eval_examples], rows).cpu()
        rejected = scorer.member_scores(prompts, [ex.rejected for ex in eval_examples], rows).cpu()
        k = cfg.reward.conservative_k
        info["eval"] = {
            "accuracy": float(preference_accuracy(chosen.mean(0), rejected.mean(0))),
            "conservative_accuracy": float(
                preference_accuracy(chosen.mean(0) - k * chosen.std(0), rejected.mean(0) - k * rejected.std(0))
            ),
            "member_accuracy": [float(preference_accuracy(c, r)) for c, r in zip(chosen, rejected)],
        }
        metrics = {
            "eval/accuracy": info["eval"]["accuracy"],
            "eval/conservative_accuracy": info["eval"]["conservative_accuracy"],
        }
        if average is not None:
            chosen = average.score(prompts, [ex.chosen for ex in eval_examples], rows).mean.cpu()
            rejected = average.score(prompts, [ex.rejected for ex in eval_examples], rows).mean.cpu()
            info["eval"]["average_accuracy"] = metrics["eval/average_accuracy"] = float(
                preference_accuracy(chosen, rejected)
            )
    write_json(root / ENSEMBLE_FILE, info)
    return metrics


def write_average(cfg: RMConfig, members: list[Path], picked: list[PreferenceExample], rows: int, device):
    """``OUT/average``: the members' weight average (``rlhfkit.models.average``) with its own score statistics
    over the same training responses as the ensemble's; returns it loaded."""
    out = weight_average(members, Path(cfg.run.output_dir) / AVERAGE_DIR)
    scorer = RewardScorer.load(str(out), device, cfg.model.trust_remote_code)
    prompts = [ex.prompt for ex in picked]
    replies = [ex.chosen for ex in picked] + [ex.rejected for ex in picked]
    scores = scorer.score(prompts * 2, replies, rows).mean.cpu()
    lengths = {"max_length": cfg.data.max_length, "max_prompt_length": cfg.data.max_prompt_length}
    stats = score_stats(scores)
    write_json(out / STATS_FILE, {**stats, **lengths})
    scorer.stats = {"mean": stats["mean"], "std": stats["std"]}  # as RewardScorer.load reads them back
    return scorer
