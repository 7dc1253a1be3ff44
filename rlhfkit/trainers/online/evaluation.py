"""Held-out evaluation of online RL (``--eval-data`` every ``--eval-steps`` and at the end).

The current policy samples one reply per held-out prompt, as the rollouts sample (same generation options,
tools and environment), and the replies are measured with the run's own rewards:

    eval/reward/score     the weighted sum of the rewards' raw scores (as ``reward/score`` in training)
    eval/reward/<name>    each reward's raw score (the reward model's score, each function's value)
    eval/kl/ref           Σ_t log π(y_t|·) − log π_ref(y_t|·) over the policy's tokens (k1, as ``kl/ref``),
                          when the run has a reference
    eval/response/length  policy tokens per reply
    eval/reward/gold      the built-in judge's score, with ``--gold-judge``

each the mean over the prompts it applies to. The replies and their measures (each reward's under
``rewards``) are appended to ``eval_samples.jsonl`` beside ``samples.jsonl``. The sampling draws from its own
random stream (a fixed seed, forked from the run's), so evaluating never changes what the training run
samples.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from rlhfkit.data.templates import render_prompt
from rlhfkit.models.forward import response_logprobs
from rlhfkit.trainers.online.rollout import PromptBatch, sample
from rlhfkit.training import engines
from rlhfkit.training.distributed import gather_objects

EVAL_SEED = 1234  # the held-out replies of every evaluation are drawn from this seed
SAMPLES_FILE = "eval_samples.jsonl"


class HeldOutEvaluator:
    """Samples the held-out prompts ``examples`` (``prompt_ids`` their encoded prompts) with a trainer's
    policy and measures the replies with its rewards and reference; ``judge(prompt text, reply)``: the gold
    judge, or None. ``evaluate`` returns the ``eval/`` metrics of every process's prompts together."""

    def __init__(self, examples: list, prompt_ids: list[list[int]], output_dir, judge=None, resume_step: int = 0):
        self.examples, self.prompt_ids, self.judge = examples, prompt_ids, judge
        self.path = Path(output_dir) / SAMPLES_FILE
        self.resume_step = resume_step
        self.started = False

    def _start_file(self) -> None:
        """A fresh file, or on resume the lines up to the resumed step (written by the main process)."""
        kept = []
        if self.resume_step and self.path.exists():
            lines = self.path.read_text(encoding="utf-8").splitlines()
            kept = [x for x in lines if x and json.loads(x)["step"] <= self.resume_step]
        self.path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
        self.started = True

    @torch.no_grad()
    def evaluate(self, trainer, step: int) -> dict[str, float]:
        """Sample and measure every held-out prompt (each process its share) with ``trainer``'s current policy,
        append the rows to ``eval_samples.jsonl``, and return the ``eval/`` metrics."""
        ranks = trainer.session.ranks
        mine = ranks.span(len(self.examples))
        size = max(1, trainer.cfg.optim.batch_size // ranks.world)
        # every process runs as many chunks (generation under a sharding engine is a collective): a process
        # whose share is shorter repeats a prompt and drops its reply
        longest = -(-len(self.examples) // ranks.world)
        rows: list[dict] = []
        device = trainer.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(EVAL_SEED + ranks.rank)
            for start in range(0, longest, size):
                index = mine[start : start + size]
                keep = len(index)
                index = index or [mine[-1] if mine else 0]
                rows += self._measure(trainer, index)[:keep]
        rows = gather_objects(rows)  # every process's, in prompt order
        for row in rows:
            row["step"] = step
        if ranks.is_main:
            if not self.started:
                self._start_file()
            with self.path.open("a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)
        return summarize(rows, trainer.rewards.names)

    def _measure(self, trainer, index: list[int]) -> list[dict]:
        """One reply per prompt of ``index`` and its measures, one dict each."""
        batch = PromptBatch(self.examples, self.prompt_ids, index, group_size=1)
        with engines.gathered_for_generation(trainer.accelerator, trainer.actor_critic):
            trainer.actor_critic.eval()
            sampled = sample(
                trainer.policy,
                trainer.tokenizer,
                batch,
                trainer.gen,
                trainer.device,
                trainer.multiturn,
                trainer.rewards.env_weight,
            )
            c, reward_batch = sampled.completions, sampled.reward_batch
            mask = c.action_mask.float()
            kl = None
            if trainer.has_reference:
                T = c.response_ids.shape[1]
                with trainer.accelerator.autocast():
                    logprobs = response_logprobs(
                        trainer.policy, c.input_ids, c.attention_mask, T, trainer.gen.temperature
                    )
                    ref = trainer.reference_logprobs(c.input_ids, c.attention_mask, T)
                kl = ((logprobs.float() - ref.float()) * mask).sum(dim=1).tolist()
        reward = trainer.rewards(reward_batch)
        lengths = mask.sum(dim=1).tolist()
        out = []
        for i, example_row in enumerate(index):
            prompt = self.examples[example_row].prompt
            row = {"prompt": prompt, "response": reward_batch.completions[i], "length": int(lengths[i])}
            row["score"] = _number(reward.score[i])
            row["rewards"] = {name: _number(values[i]) for name, values in reward.components.items()}
            if kl is not None:
                row["kl"] = kl[i]
            if self.judge is not None:
                row["gold"] = float(self.judge(render_prompt(trainer.tokenizer, prompt), reward_batch.completions[i]))
            if reward_batch.messages is not None:
                row["messages"] = reward_batch.messages[i]
            out.append(row)
        return out


def _number(value: torch.Tensor) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def summarize(rows: list[dict], reward_names: list[str]) -> dict[str, float]:
    """The ``eval/`` metrics of measured rows: each measure's mean over the rows it applies to (not None)."""
    measures = {"reward/score": [row.get("score") for row in rows]}
    measures.update({f"reward/{name}": [row["rewards"].get(name) for row in rows] for name in reward_names})
    for key, name in (("kl", "kl/ref"), ("gold", "reward/gold"), ("length", "response/length")):
        measures[name] = [row.get(key) for row in rows]
    metrics = {}
    for name, values in measures.items():
        values = [v for v in values if v is not None]
        if values:
            metrics[f"eval/{name}"] = sum(values) / len(values)
    return metrics
