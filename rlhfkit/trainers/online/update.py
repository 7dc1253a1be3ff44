"""Step 7 of the online loop: epochs over shuffled minibatches of the rollout, each minibatch's loss
(``rlhfkit.ops.ppo_loss``: clipped surrogate + c1*value loss - c2*entropy + KL in the loss) back-propagated over
its micro-batches, then one optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from rlhfkit import ops
from rlhfkit.config.online import OnlineConfig
from rlhfkit.trainers.online.policy import ActorCriticOutput, Networks
from rlhfkit.trainers.online.rollout import Rollout
from rlhfkit.training import updates
from rlhfkit.training.distributed import any_rank, reduce_sum

# the logged name of each of ops.ppo_loss's terms
LOSS_METRICS = {
    "total": "loss/total",
    "policy": "loss/policy",
    "value": "loss/value",
    "value_clipfrac": "value/clipfrac",
    "entropy": "policy/entropy",
    "clipfrac": "policy/clipfrac",
    "approx_kl": "policy/approx_kl",
    "kl": "loss/kl",
}


def loss_metrics(terms: ops.PPOLossTerms, weight: float = 1.0) -> dict[str, float]:
    """The loss terms as logged metrics (``LOSS_METRICS``), each times ``weight``; the terms left out are absent."""
    return {LOSS_METRICS[name]: float(value) * weight for name, value in terms._asdict().items() if value is not None}


def loss_config(cfg: OnlineConfig, max_tokens: int) -> ops.PPOLossConfig:
    """The coefficients and choices of ``ops.ppo_loss`` that a run's options set (``max_tokens``: the most policy
    tokens of a row, the length a Dr. GRPO token sum is normalised by)."""
    p, critic = cfg.policy, (getattr(cfg, "critic", None) if cfg.needs_critic else None)
    return ops.PPOLossConfig(
        policy_loss=p.importance_ratio,
        clip_eps=p.clip_eps,
        clip_eps_high=p.clip_eps_high,
        vf_coef=critic.vf_coef if critic is not None else 0.0,
        value_clip=critic.value_clip if critic is not None else None,
        entropy_coef=p.entropy_coef,
        aggregation=p.loss_aggregation,
        max_len=max_tokens,
        importance_sampling_cap=cfg.vllm.vllm_importance_sampling_cap,
    )


class LossNormaliser:
    """Weights micro-batch losses so that accumulating them, and averaging the gradients over processes, gives
    exactly the loss of the whole minibatch under ``--loss-aggregation``.

    A micro-batch's loss is a mean over its own loss units (tokens for token-mean, non-empty rows for
    seq-mean-token-mean, rows for the other per-sequence aggregations); its weight is its units over the
    minibatch's units on all processes, times the number of processes (which the averaging divides out). A
    value loss (a token mean) under a per-sequence aggregation is weighted by rows too."""

    def __init__(self, aggregation: str, num_processes: int):
        self.aggregation, self.num_processes = aggregation, num_processes

    def units(self, loss_mask: torch.Tensor) -> float:
        """The loss units of rows with ``loss_mask`` ``[b, T]``."""
        if self.aggregation == "token-mean":
            return float(loss_mask.sum())
        if self.aggregation == "seq-mean-token-mean":
            return float((loss_mask.sum(dim=1) > 0).sum())
        return float(loss_mask.shape[0])

    def weight(self, micro_loss_mask: torch.Tensor, minibatch_units: float) -> float:
        """The weight of a micro-batch's loss in its minibatch's (``minibatch_units``: on all processes)."""
        return self.units(micro_loss_mask) * self.num_processes / max(minibatch_units, 1.0)


class PPOUpdate:
    """The epochs of clipped updates on one rollout (step 7). ``forward(rows, networks)``: a teacher-forced pass
    with gradients over a ``Rollout``'s rows (log-probs, values, entropies); ``value_rows(rows)``: where a separate
    value model's forward and backward run apart from the policy's, the rows of its micro-batches for the policy's
    ``rows`` (None: one joint pass); ``shuffle``: the minibatch order's generator."""

    def __init__(
        self,
        cfg: OnlineConfig,
        accelerator,
        actor_critic,
        optimizer,
        scheduler,
        value_rows: Callable[[int], int] | None,
        forward: Callable[[Rollout, Networks], ActorCriticOutput],
        shuffle: torch.Generator,
        max_tokens: int,
    ):
        self.cfg, self.accelerator, self.actor_critic = cfg, accelerator, actor_critic
        self.optimizer, self.scheduler, self.value_rows = optimizer, scheduler, value_rows
        self.forward, self.shuffle = forward, shuffle
        self.critic = getattr(cfg, "critic", None) if cfg.needs_critic else None
        self.normaliser = LossNormaliser(cfg.policy.loss_aggregation, accelerator.num_processes)
        self.loss_config = loss_config(cfg, max_tokens)

    def loss(
        self, mb: Rollout, networks: Networks, kl_coef: float | None, outputs: ActorCriticOutput | None = None
    ) -> tuple[torch.Tensor, ops.PPOLossTerms]:
        """The loss of one (micro-)batch over ``networks`` (``ops.ppo_loss``): the value term only where the value
        function runs, the others only where the policy does. ``kl_coef``: the KL term's weight in the loss, None
        for no KL term. ``outputs``: this batch's forward outputs, already run with gradients."""
        if outputs is None:
            outputs = self.forward(mb, networks)
        policy = networks is not Networks.VALUE
        critic = self.critic is not None and networks is not Networks.POLICY
        return ops.ppo_loss(
            replace(self.loss_config, kl_coef=kl_coef or 0.0),
            mb.loss_mask.float(),
            logprobs=outputs.logprobs if policy else None,
            old_logprobs=mb.logprobs,
            advantages=mb.advantages,
            entropy=outputs.entropy if policy else None,
            ref_logprobs=mb.ref_logprobs if policy and kl_coef is not None else None,
            values=outputs.values if critic else None,
            old_values=mb.values,
            returns=mb.returns,
            engine_logprobs=mb.engine_logprobs if policy else None,
        )

    def train_epochs(
        self,
        rollout: Rollout,
        kl_coef: float | None,
        first_pass: ActorCriticOutput | None = None,
        value_only: bool = False,
    ) -> dict[str, float] | None:
        """Epochs over shuffled minibatches; returns the loss terms averaged over the updates, or None when a
        loss was not finite (no update was made then). ``first_pass``: the whole rollout's forward outputs,
        which stand in for epoch 1's forward of its single minibatch. ``value_only``: only the separate value
        model runs and learns (the value function's warm-up)."""
        B = rollout.scores.shape[0]
        mb_size = B // self.cfg.policy.num_minibatches
        sums: dict[str, float] = {}
        n = 0
        self.actor_critic.train()
        for epoch in range(self.cfg.policy.ppo_epochs):
            order = torch.randperm(B, generator=self.shuffle)
            reuse = epoch == 0 and first_pass is not None
            for start in range(0, B, mb_size):
                mb_index = order[start : start + mb_size]
                stats = self.minibatch_backward(rollout, mb_index, kl_coef, first_pass if reuse else None, value_only)
                if any_rank(self.accelerator, not math.isfinite(stats["loss/total"])):
                    self.optimizer.zero_grad(set_to_none=True)
                    return None
                stats["grad_norm"] = updates.step(
                    self.accelerator, self.actor_critic, self.optimizer, self.scheduler, self.cfg.optim.max_grad_norm
                )
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + value
                n += 1
        return {k: v / n for k, v in sums.items()}

    def passes(self, micro_rows: int, value_only: bool = False) -> list[tuple[Networks, int]]:
        """The forward and backward passes of one minibatch, as (networks, rows per micro-batch): one joint pass;
        or the policy's, then the separate value model's (``value_rows``); with ``value_only`` the value model's
        alone."""
        if value_only:
            return [(Networks.VALUE, self.value_rows(micro_rows) if self.value_rows is not None else micro_rows)]
        if self.value_rows is None:
            return [(Networks.ALL, micro_rows)]
        return [(Networks.POLICY, micro_rows), (Networks.VALUE, self.value_rows(micro_rows))]

    def minibatch_backward(
        self,
        rollout: Rollout,
        mb_index: torch.Tensor,
        kl_coef: float | None,
        first_pass: ActorCriticOutput | None,
        value_only: bool = False,
    ) -> dict[str, float]:
        """The backward passes of one minibatch's loss (rows ``mb_index`` of ``rollout``), over its micro-batches
        and passes (``passes``); returns its loss terms."""
        units = reduce_sum(self.accelerator, self.normaliser.units(rollout.loss_mask[mb_index]))
        micro_rows = len(mb_index) // self.cfg.optim.gradient_accumulation_steps
        stats: dict[str, float] = {}
        for networks, rows in self.passes(micro_rows, value_only):

            def loss_fn(mb: Rollout, networks: Networks = networks):
                outputs = None
                if first_pass is not None and networks is not Networks.VALUE:  # the rows in minibatch order
                    outputs = ActorCriticOutput(*(_select(o, mb_index) for o in first_pass))
                loss, terms = self.loss(mb, networks, kl_coef, outputs)
                weight = self.normaliser.weight(mb.loss_mask, units)
                return loss * weight, loss_metrics(terms, weight)

            micro = [
                rollout.select(mb_index[i : i + rows].to(rollout.scores.device)) for i in range(0, len(mb_index), rows)
            ]
            for key, value in updates.accumulate(self.accelerator, self.actor_critic, micro, loss_fn).items():
                stats[key] = stats.get(key, 0.0) + value
        return stats


def _select(x: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    return x[index.to(x.device)] if x is not None else None
