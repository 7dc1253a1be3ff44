"""Signs that the vLLM engine sampling the rollouts (--use-vllm) and the trainer disagree.

The trainer learns from the engine's samples as if its own policy had drawn them. Two things would break that
without stopping the run, and both show in a step's rollout:

- **The log-prob gap right after a weight sync.** The engine's log-prob of each token it sampled against the
  trainer's ``log pi_old`` of it (``rollout/logprob_diff``). On a step whose sampling loaded the trained weights
  first, it is float rounding (about 1e-5 in fp32, more in bf16); well above that, the engine holds other weights
  than the trainer (or computes another function), so the rollouts come from another policy than the one
  trained. Steps that sample with weights up to ``--vllm-sync-steps`` updates old are not checked: there a gap is
  expected.
- **Groups of identical replies that the engine itself found improbable.** A prompt's G completions are G
  independent draws. All G the same while the engine gives that reply a probability p is a chance of p^(G-1);
  several such groups in one step mean the draws are not independent (a sampler whose randomness repeats), and a
  group of identical replies scores the same and teaches GRPO / RLOO nothing.

Each warning is one line, written when its sign appears and again only after it went away and came back, as the
reward-hacking warnings are (``rlhfkit.trainers.online.monitor``).
"""

from __future__ import annotations

import math

import torch

GAP_LIMIT = 0.05  # mean |log pi_old - log pi_engine| right after a sync; fp32 rounding is ~1e-5, bf16 ~1e-2
CHANCE_LIMIT = 0.01  # a group of G identical replies with p^(G-1) below this is improbable


def improbable_identical_groups(
    response_ids: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor, group_size: int
) -> tuple[int, int]:
    """(groups whose ``group_size`` replies are all the same although the engine's probability p of that reply
    makes it a chance of p^(G-1) < ``CHANCE_LIMIT``, groups). ``response_ids`` / ``engine_logprobs`` / ``mask``
    ``[B, T]``, a group's rows contiguous; the log-probs are the engine's own (after temperature, top-k, top-p),
    0 where ``mask`` is 0."""
    B, G = response_ids.shape[0], group_size
    if G < 2 or B % G:
        return 0, B // max(G, 1)
    ids = (response_ids * mask).view(B // G, G, -1)
    lengths = mask.sum(dim=1).view(B // G, G)
    same = (ids == ids[:, :1]).all(dim=2).all(dim=1) & (lengths == lengths[:, :1]).all(dim=1)  # [B/G]
    reply_logprob = (engine_logprobs * mask).sum(dim=1).view(B // G, G)[:, 0]  # log p of the group's first reply
    improbable = same & ((G - 1) * reply_logprob < math.log(CHANCE_LIMIT))
    return int(improbable.sum()), B // G


class EngineCheck:
    """Watches each step's rollout and metrics for the signs above; warns through ``logger.write``."""

    def __init__(self, logger, group_size: int):
        self.logger, self.group_size = logger, group_size
        self.active: set[str] = set()
        self.warnings = 0

    def _warn(self, kind: str, on: bool, step: int, message: str) -> None:
        if on and kind not in self.active:
            self.warnings += 1
            self.logger.write(f"warning (step {step}): the vLLM engine and the trainer disagree: {message}")
        (self.active.add if on else self.active.discard)(kind)

    def observe(self, step: int, rollout, metrics: dict) -> None:
        """``rollout``: the whole batch's ``Rollout`` (with ``engine_logprobs``); ``metrics``: the step's."""
        gap = metrics.get("rollout/logprob_diff")
        if gap is not None and "time/weight_sync_s" in metrics:
            self._warn(
                "gap",
                gap > GAP_LIMIT,
                step,
                f"right after loading the trained weights the engine's log-probs of its samples differ from the "
                f"trainer's by {gap:.3g} on average (rollout/logprob_diff; float rounding is about 1e-5 in fp32): "
                "the engine samples from another policy than the one being trained",
            )
        if rollout is None or rollout.engine_logprobs is None:
            return
        n, groups = improbable_identical_groups(
            rollout.response_ids, rollout.engine_logprobs, rollout.action_mask, self.group_size
        )
        self._warn(
            "identical",
            n >= max(2, math.ceil(groups / 4)),
            step,
            f"in {n} of {groups} groups all {self.group_size} replies are the same although the engine gives such "
            f"a reply a chance below {CHANCE_LIMIT} of repeating {self.group_size - 1} times: its draws are not "
            "independent, and groups of identical replies carry no learning signal",
        )
