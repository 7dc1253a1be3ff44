"""Step 8 of the online loop: metrics of a rollout, the step's timings, sample generations, and the held-out
gold judge."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rlhfkit import ops
from rlhfkit.data.encode import encode_prompt
from rlhfkit.data.templates import render_prompt
from rlhfkit.errors import UserError, option
from rlhfkit.models.sampling import decode, sample_responses
from rlhfkit.tasks import get_judge
from rlhfkit.trainers.online.rollout import Rollout

GOLD_PROMPTS = 64  # held-out prompts sampled for reward/gold
SAMPLES_PER_STEP = 4


@contextmanager
def timed(metrics: dict[str, float], name: str) -> Iterator[None]:
    """``metrics[name]``: the wall-clock seconds the ``with`` block took (``time/generate_s``, ``time/step_s``, ...),
    written as the block ends, also by a ``return`` inside it; a block that raises records nothing."""
    start = time.perf_counter()
    yield
    metrics[name] = time.perf_counter() - start


def rollout_metrics(r: Rollout, kl_coef: float) -> dict[str, float]:
    """The metrics that come from the experience itself (the update adds the loss terms): the KL ones only
    with a reference, the value ones only with a critic. ``reward/score`` is the mean over the completions
    some reward applies to. Token counts and the KL cover the policy's tokens only (``action_mask``)."""
    mask = r.action_mask.float()
    scored = r.raw_scores[~torch.isnan(r.raw_scores)]
    out = {
        "reward/score": float(scored.mean()) if scored.numel() else math.nan,
        "reward/score_std": float(scored.std()) if scored.numel() > 1 else 0.0,
        "reward/shaped_score": float(r.scores.mean()),
        "reward/total": float(r.rewards.sum(dim=1).mean()),
    }
    if r.ref_logprobs is not None:
        kl_seq = ((r.logprobs - r.ref_logprobs) * mask).sum(dim=1)  # [B] per-sequence KL (k1 estimate)
        k3 = ops.kl_penalty(r.logprobs, r.ref_logprobs, "k3") * mask
        out.update({"kl/ref": float(kl_seq.mean()), "kl/ref_k3": float(k3.sum(dim=1).mean())})
    out["kl/coef"] = float(kl_coef)
    if r.values is not None:
        out["value/explained_variance"] = float(ops.explained_variance(r.values, r.returns, mask))
        out["value/mean"] = float(ops.masked_mean(r.values, mask))
    out["response/length"] = float(mask.sum(dim=1).mean())
    return out


def reward_metrics(components: dict[str, torch.Tensor], valid: torch.Tensor, algorithm: str) -> dict[str, float]:
    """``reward/<name>`` of each component when there are several (mean where it applies), and the share
    of completions no reward applied to."""
    out: dict[str, float] = {}
    if len(components) > 1 or algorithm != "ppo":
        for name, values in components.items():
            applies = ~torch.isnan(values)
            out[f"reward/{name}"] = float(values[applies].mean()) if applies.any() else math.nan
    if not bool(valid.all()):
        out["reward/unscored_fraction"] = float((~valid).float().mean())
    return out


class SampleWriter:
    """Appends ``{"step", "prompt", "response", "score"}`` lines to ``samples.jsonl`` and TensorBoard text."""

    def __init__(self, output_dir, logger, resume_step: int = 0):
        self.path = Path(output_dir) / "samples.jsonl"
        self.logger = logger
        if logger.enabled:
            kept = []
            if resume_step and self.path.exists():
                kept = [x for x in self.path.read_text().splitlines() if x and json.loads(x)["step"] <= resume_step]
            self.path.write_text("".join(x + "\n" for x in kept))

    def write(self, step: int, prompts: list, r: Rollout, tokenizer, world: int = 1, messages=None) -> None:
        """The first few completions of each process's block of the whole batch ``r`` (``prompts`` aligned).
        ``messages``: each row's whole conversation (multi-turn rollouts), written as ``messages``; the
        ``response`` is then the conversation after the prompt as text, tool and environment turns included."""
        if not self.logger.enabled:
            return
        block = len(prompts) // world
        index = [rank * block + i for rank in range(world) for i in range(min(SAMPLES_PER_STEP, block))]
        texts = tokenizer.batch_decode(r.response_ids[index], skip_special_tokens=True)
        scores = r.raw_scores.tolist()
        rows = []
        for i, text in zip(index, texts):
            row = {"step": step, "prompt": prompts[i], "response": text}
            row["score"] = float(scores[i]) if math.isfinite(scores[i]) else None
            if messages is not None:
                row["messages"] = messages[i]
            if world > 1:
                row["rank"] = i // block
            rows.append(row)
        with self.path.open("a") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
        table = "\n\n".join(
            f"**prompt** {row['prompt']}  \n**response** {_conversation_text(row)}  \n**score** "
            + ("-" if row["score"] is None else f"{row['score']:.3f}")
            for row in rows
        )
        self.logger.text("samples", table, step)


def _conversation_text(row: dict) -> str:
    """A sample's reply, or for a conversation its turns after the prompt, each marked with its role."""
    if "messages" not in row:
        return row["response"]
    start = 1 if row["messages"] and row["messages"][0]["role"] == "system" else 0
    turns = row["messages"][start + 1 :] if isinstance(row["prompt"], str) else row["messages"][len(row["prompt"]) :]
    return "  \n".join(f"[{m['role']}] {m['content']}" for m in turns)


class GoldEvaluator:
    """Samples responses to held-out prompts and averages a task's gold judge (never used for training)."""

    def __init__(self, judge, prompts: list[str], columns: dict[str, list] | None = None):
        self.judge, self.prompts, self.columns = judge, prompts, columns or {}

    @classmethod
    def create(cls, name: str, eval_examples: list) -> GoldEvaluator | None:
        if not name:
            return None
        try:
            judge = get_judge(name)
        except ValueError as exc:
            raise UserError(f"{option('gold_judge')}: {exc}") from None
        if not eval_examples:
            raise UserError(f"{option('gold_judge')} needs held-out prompts in {option('eval_data')}")
        examples = eval_examples[:GOLD_PROMPTS]
        names = list(dict.fromkeys(k for ex in examples for k in ex.extra))
        return cls(judge, [ex.prompt for ex in examples], {k: [ex.extra.get(k) for ex in examples] for k in names})

    @torch.no_grad()
    def responses(self, policy, tokenizer, cfg, device, seed: int = 1234, multiturn=None) -> list[str]:
        """One sampled reply per held-out prompt; with ``multiturn`` (``rlhfkit.multiturn.rollout.MultiTurn``)
        each is a conversation with the run's tools and environment, and its last reply is judged."""
        with torch.random.fork_rng(devices=[]):  # sampling here must not shift the training run's randomness
            torch.manual_seed(seed)
            if multiturn is not None:
                rows = list(range(len(self.prompts)))
                convs = multiturn.rollout(policy, self.prompts, rows, self.columns, cfg.generation, device)
                return [c.reply for c in convs]
            ids = [encode_prompt(tokenizer, p, cfg.data.max_prompt_length) for p in self.prompts]
            responses = sample_responses(policy, tokenizer, ids, cfg.generation, len(ids), device)
        return [decode(tokenizer, r) for r in responses]

    def evaluate(self, policy, tokenizer, cfg, device, multiturn=None) -> float:
        texts = self.responses(policy, tokenizer, cfg, device, multiturn=multiturn)
        scores = [self.judge(render_prompt(tokenizer, p), t) for p, t in zip(self.prompts, texts)]
        return sum(scores) / len(scores)
