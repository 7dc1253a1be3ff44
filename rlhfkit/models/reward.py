"""Reward models: build one, read its score, and load one (or an ensemble) to score text.

A reward model is an ``AutoModelForSequenceClassification`` with one output. Where its score is read:

- Decoders (GPT-2, Llama, Qwen2, GPT-NeoX, ...) have a per-position head ``score`` (hidden -> 1). The
  reward is the head's value at the LAST REAL token of prompt + response, i.e. at
  ``attention_mask.sum() - 1`` of a right-padded row. We gather it ourselves instead of using the
  model's own pooling, which looks for the last token that differs from ``pad_token_id``: when the pad
  token is EOS (the fallback for tokenizers without one) that skips the EOS ending every response.
- Encoders (BERT-like) pool the first ([CLS]) token themselves; their output logit is the score.

A directory made by ``rlhfkit rm`` also holds ``reward_stats.json`` (score mean/std over the training
responses, at most 500 pairs' worth, for PPO's reward normalisation, and the lengths the model was trained
with). An ensemble directory holds ``ensemble.json``, listing member directories relative to it (``"."``
is the root, itself member 0, so ``from_pretrained(OUT)`` still loads a working reward model) and the
ensemble's statistics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rlhfkit.data.collate import SequenceBatch, chunks, collate_pairs
from rlhfkit.data.encode import Encoded, encode_pair
from rlhfkit.data.schema import Text
from rlhfkit.errors import UserError
from rlhfkit.models.fastpath import replaceable
from rlhfkit.models.loading import (
    STATS_FILE,
    load_pretrained,
    load_reward_model,
    load_tokenizer,
    match_tokenizer,
)
from rlhfkit.models.unwrap import base_model, without_ddp

ENSEMBLE_FILE = "ensemble.json"
DEFAULT_MAX_PROMPT_LENGTH = 128


def is_encoder(model) -> bool:
    """True when the classifier pools a first ([CLS]) token itself (BERT-like encoders).

    Decoder classifiers in transformers carry a per-position linear head named ``score`` and pool the
    last token; that head is what tells the two kinds apart. A model with neither (remote code) is
    treated like an encoder: its own pooled output is the score.
    """
    head = getattr(base_model(model), "score", None)
    head = getattr(head, "original_module", head)  # trained in full beside LoRA adapters (PEFT's modules_to_save)
    return not isinstance(head, torch.nn.Linear)


def build_reward_model(path: str, tokenizer, trust_remote_code: bool = False):
    """A one-output sequence classifier from a local model directory.

    A causal LM (e.g. the SFT model) keeps its backbone and gets a new ``score`` head with the
    architecture's standard initialisation (seed torch first for a reproducible head). An encoder or
    an existing classifier keeps its weights; a classifier head of another width is re-initialised.
    """
    from transformers import AutoModelForSequenceClassification

    model = load_pretrained(
        AutoModelForSequenceClassification, path, "model", trust_remote_code, num_labels=1, ignore_mismatched_sizes=True
    )
    match_tokenizer(model, tokenizer, path)
    return model


@replaceable
def sequence_scores(model, batch: SequenceBatch) -> torch.Tensor:
    """``[B]`` float32 reward of each right-padded prompt + response row (carries the gradient)."""
    inner = without_ddp(model)
    if is_encoder(inner):
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, 0].float()
    per_position = head_outputs(inner, lambda: model(input_ids=batch.input_ids, attention_mask=batch.attention_mask))
    last = batch.last_token_index()  # [B]
    return per_position[torch.arange(len(last), device=last.device), last].float()


def head_outputs(inner, run) -> torch.Tensor:
    """The ``score`` head's output at every position ``[..., L]`` of a decoder reward model ``inner`` (the model
    inside any DDP wrapper) during ``run()``, the model's forward; its own pooling is not used (module docstring)."""
    captured: list[torch.Tensor] = []
    handle = inner.score.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    try:
        run()
    finally:
        handle.remove()
    return captured[-1][..., 0]


@torch.no_grad()
def score_encoded(model, items: list[Encoded], pad_id: int, batch_size: int, device) -> torch.Tensor:
    """``[N]`` scores of encoded rows, in order; rows are batched by length to waste little padding.
    Eval mode is set for the pass and the previous mode restored.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt_ids) + len(items[i].response_ids))
    out = torch.empty(len(items), dtype=torch.float32)
    for idx in chunks(order, batch_size):
        batch = collate_pairs([items[i] for i in idx], pad_id).to(device)
        out[idx] = sequence_scores(model, batch).cpu()
    model.train(was_training)
    return out


def score_stats(scores: torch.Tensor) -> dict[str, float]:
    """Mean and (unbiased) standard deviation of a ``[N]`` score tensor, for reward normalisation."""
    std = float(scores.std()) if scores.numel() > 1 else 0.0
    return {"mean": float(scores.mean()), "std": std, "count": int(scores.numel())}


def _position_limit(config) -> int:
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: not valid JSON") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


@dataclass
class ScoreOutput:
    """Scores of B prompt/response rows.

    mean: [B] ensemble mean (for a single model, its score)
    std:  [B] standard deviation across ensemble members (unbiased); None for a single model
    members: [K, B] each member's scores; None for a single model
    """

    mean: torch.Tensor
    std: torch.Tensor | None = None
    members: torch.Tensor | None = None

    def conservative(self, k: float) -> torch.Tensor:
        """``[B]`` mean − k·std, a pessimistic score where members disagree (the mean for one model)."""
        return self.mean if self.std is None else self.mean - k * self.std


@dataclass
class _Member:
    model: torch.nn.Module
    tokenizer: object


class RewardScorer:
    """Scores prompt/response texts with a reward model or an ensemble, each member with its own tokenizer.

    stats: {"mean": float, "std": float} over the training responses (of the ensemble mean for an
        ensemble), or None when the directory has none
    conservative_k: the k of ``ScoreOutput.conservative`` chosen at training time (1.0 if unknown)
    max_length, max_prompt_length: truncation of prompt + response (the lengths used in training)
    """

    def __init__(
        self,
        members: list[_Member],
        device,
        stats: dict | None = None,
        conservative_k: float = 1.0,
        max_length: int | None = None,
        max_prompt_length: int = DEFAULT_MAX_PROMPT_LENGTH,
    ):
        self.members = members
        self.device = torch.device(device)
        self.stats = stats
        self.conservative_k = conservative_k
        self.max_length = max_length or min(_position_limit(m.model.config) for m in members)
        self.max_prompt_length = max_prompt_length

    @classmethod
    def load(cls, path: str, device, trust_remote_code: bool = False) -> RewardScorer:
        """Load a reward-model directory, or an ensemble directory (one with ``ensemble.json``)."""
        root = Path(path)
        ensemble = _read_json(root / ENSEMBLE_FILE) if root.is_dir() else None
        member_dirs = [root] if ensemble is None else [root / m for m in ensemble.get("members", [])]
        if not member_dirs:
            raise UserError(f"{root / ENSEMBLE_FILE}: 'members' lists no reward models")
        members = []
        for d in member_dirs:
            tokenizer = load_tokenizer(str(d), trust_remote_code)
            model = load_reward_model(str(d), trust_remote_code, tokenizer).to(device).eval()
            members.append(_Member(model, tokenizer))
        own = _read_json(root / STATS_FILE) or {}
        stats = ensemble.get("stats") if ensemble is not None else (own or None)
        if stats is not None:
            stats = {"mean": float(stats["mean"]), "std": float(stats["std"])}
        k = float(ensemble.get("conservative_k", 1.0)) if ensemble is not None else 1.0
        return cls(
            members,
            device,
            stats,
            k,
            own.get("max_length"),
            own.get("max_prompt_length", DEFAULT_MAX_PROMPT_LENGTH),
        )

    @property
    def is_ensemble(self) -> bool:
        return len(self.members) > 1

    @torch.no_grad()
    def member_scores(
        self, prompts: list[Text], responses: list[Text], batch_size: int = 32, finished: list[bool] | None = None
    ) -> torch.Tensor:
        """``[K, B]`` scores of each member (K = 1 for a single model), on the scorer's device.

        ``finished[i]`` False marks a response that was cut off (it never emitted EOS): it is scored as
        it stands, without the EOS that ended every response the reward model was trained on, so a cut
        reply is not read as a complete one. None means every response is complete.
        """
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        if finished is None:
            finished = [True] * len(responses)
        rows = []
        for m in self.members:
            items = [
                encode_pair(m.tokenizer, p, r, self.max_length, self.max_prompt_length, add_eos=done)
                for p, r, done in zip(prompts, responses, finished)
            ]
            rows.append(score_encoded(m.model, items, m.tokenizer.pad_token_id, batch_size, self.device))
        return torch.stack(rows).to(self.device)

    def score(
        self, prompts: list[Text], responses: list[Text], batch_size: int = 32, finished: list[bool] | None = None
    ) -> ScoreOutput:
        """Scores of B rows: ``prompts`` are strings or message lists, ``responses`` decoded texts;
        ``finished`` as in ``member_scores``."""
        scores = self.member_scores(prompts, responses, batch_size, finished)
        if not self.is_ensemble:
            return ScoreOutput(scores[0])
        return ScoreOutput(scores.mean(dim=0), scores.std(dim=0), scores)
