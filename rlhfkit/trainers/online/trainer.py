"""`rlhfkit ppo`, `rlhfkit grpo`, `rlhfkit rloo`: one online-RL loop, the algorithm a choice of options.

One step (``OnlineTrainer.step``) is the loop of the RLHF literature:
  1. generate G completions per prompt with the current policy
  2. reward them (reward model, Python functions, a task's judge; weighted)
  3. log-probs under the rollout ("old") policy and, when a KL term needs it, the frozen reference
  4. values from the value function (same forward pass as 3 for a value head; only with a critic)
  5. per-token rewards r_t = -beta*KL_t (when the KL is in the reward), plus the reward at the last real token
  6. advantages: the algorithm's estimator (GAE, sequence, GRPO, RLOO, REINFORCE++), ``rlhfkit.ops.estimators``
  7. epochs over minibatches: clipped surrogate + c1*value loss - c2*entropy (+ beta*KL in the loss), each
     token loss reduced by --loss-aggregation
  8. update beta, log, write samples

PPO is GAE with a critic and the KL in the reward; GRPO is the group estimator with the KL in the loss and
one update per batch; RLOO the leave-one-out estimator with one importance ratio per completion. Their
defaults are the configs in ``rlhfkit.config.online``.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch

from rlhfkit import ops
from rlhfkit.accel.packing import PackedBatch, can_pack, pack_batch
from rlhfkit.config.online import CRITIC_ESTIMATORS, GROUP_ESTIMATORS, OnlineConfig
from rlhfkit.errors import UserError, option
from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.lora import adapters_off
from rlhfkit.multiturn.rollout import MultiTurn, conversation_metrics
from rlhfkit.trainers.online.policy import ActorCritic
from rlhfkit.trainers.online.reporting import rollout_metrics
from rlhfkit.trainers.online.rewards import RewardBatch, Rewards
from rlhfkit.trainers.online.rollout import Rollout, action_order, conversation_tensors, gather_rollout, generate
from rlhfkit.training import engines, updates
from rlhfkit.training.distributed import any_rank, gather_rows, reduce_mean, reduce_sum
from rlhfkit.training.runtime import keep_freed_memory, release_freed_memory
from rlhfkit.training.stream import IndexStream

MAX_BAD_UPDATES = 3  # consecutive non-finite steps before the run stops
VALUE_PASS_SPLIT = 4  # the value model's pass apart runs in micro-batches this many times smaller


def value_chunk_rows(rows: int) -> int:
    """Rows of each of the value model's micro-batches when its pass runs apart on a batch of ``rows``."""
    return max(1, -(-rows // VALUE_PASS_SPLIT))


class OnlineTrainer:
    """Holds the roles (policy, optional critic, optional reference, rewards) and runs ``step``. Built by
    ``rlhfkit.trainers.online.run.train``; usable from Python too.

    ``ref_model``: the frozen reference, or None: then with LoRA the reference is the policy's backbone
    with its adapters off, and without LoRA there is none (no KL term needs one: ``cfg.needs_reference``).
    ``multiturn``: the tools and environment of multi-turn rollouts (``rlhfkit.multiturn``); None: one reply
    per prompt.
    """

    def __init__(
        self,
        cfg: OnlineConfig,
        actor_critic: ActorCritic,
        ref_model,
        rewards: Rewards,
        tokenizer,
        session,
        multiturn: MultiTurn | None = None,
    ):
        self.cfg, self.gen = cfg, cfg.generation
        self.multiturn = multiturn
        self.last_messages: list | None = None  # the conversations of the last multi-turn rollout (samples)
        # the most policy tokens of a row (the length a Dr. GRPO token sum is normalised by)
        self.max_tokens = self.gen.max_new_tokens * (cfg.multiturn.max_turns if multiturn is not None else 1)
        self.policy_args, self.kl_args, self.adv_args = cfg.policy, cfg.kl, cfg.advantage
        self.critic_args = getattr(cfg, "critic", None) if actor_critic.has_critic else None
        self.actor_critic, self.ref_model, self.rewards = actor_critic, ref_model, rewards
        self.tokenizer, self.session = tokenizer, session
        self.accelerator = session.accelerator
        self.device = session.device
        # on the CPU the phases of a step reuse the heap memory the previous one freed (runtime.keep_freed_memory)
        self.reuses_freed_memory = self.device.type == "cpu" and keep_freed_memory()
        k = self.kl_args
        self.has_reference = cfg.needs_reference and (ref_model is not None or cfg.lora.lora_r > 0)
        self.kl_ctl = (
            ops.AdaptiveKLController(k.kl_coef, k.target_kl, k.kl_horizon)
            if k.target_kl is not None
            else ops.FixedKLController(k.kl_coef)
        )
        if cfg.optim.gradient_checkpointing:
            value = actor_critic.value_model
            updates.enable_gradient_checkpointing(actor_critic.policy, value.backbone if value is not None else None)
        self.updates_per_step = self.policy_args.ppo_epochs * self.policy_args.num_minibatches
        optim_args = replace(cfg.optim, warmup_steps=cfg.optim.warmup_steps * self.updates_per_step)
        self.optimizer = updates.build_optimizer(self.actor_critic, optim_args)
        self.scheduler = updates.build_scheduler(
            self.optimizer, optim_args, session.total_steps * self.updates_per_step
        )
        self.actor_critic, self.optimizer = self.accelerator.prepare(self.actor_critic, self.optimizer)
        if self.reuses_freed_memory:  # the moments low in the heap, below every step's short-lived tensors
            updates.create_optimizer_state(self.optimizer)
        self.shuffle = torch.Generator().manual_seed(cfg.run.seed)  # minibatch order
        self.bad_steps = 0
        value = actor_critic.value_model
        models = [self.policy, self.ref_model, value.backbone if value is not None else None]
        self.pack_sequences = cfg.packing.pack_sequences and all(can_pack(m) for m in models if m is not None)
        if self.value_pass_early:  # its gradients wait from the rollout to the step: the embedding's rows only
            updates.sparse_embedding_grads(self.accelerator.unwrap_model(self.actor_critic).value_model)
        self.advantage_config = ops.AdvantageConfig(
            gamma=self.adv_args.gamma,
            lam=self.adv_args.lam,
            group_size=self.adv_args.num_generations,
            scale=self.adv_args.scale_rewards,
        )

    @property
    def policy(self):
        return self.accelerator.unwrap_model(self.actor_critic).policy

    @property
    def kl_in_reward(self) -> bool:
        return self.has_reference and not self.kl_args.kl_in_loss

    def packed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> PackedBatch | None:
        """The batch packed for the teacher-forced passes (``--pack-sequences``), or None to run it padded.
        The completions of one prompt may share one copy of it (``pack_batch``)."""
        if not self.pack_sequences:
            return None
        return pack_batch(self.policy, input_ids, attention_mask, self.tokenizer.pad_token_id, prompt_width)

    def reference_logprobs(self, input_ids, attention_mask, n_response: int, packed) -> torch.Tensor:
        """``[B, T]`` log-probs under the frozen reference (LoRA: the policy with its adapters off)."""
        temperature = self.gen.temperature
        if self.ref_model is None:
            # the policy is called outside the wrapped actor-critic's forward: under FSDP2 its parameters are
            # gathered for the pass, as for sampling
            with engines.gathered_for_generation(self.accelerator, self.actor_critic), adapters_off(self.policy):
                return response_logprobs(self.policy, input_ids, attention_mask, n_response, temperature, packed)
        return response_logprobs(self.ref_model, input_ids, attention_mask, n_response, temperature, packed)

    # ---- steps 1-6: experience -------------------------------------------------------------
    @property
    def reuses_first_pass(self) -> bool:
        """One minibatch, no accumulation, no dropout: the first epoch's forward pass (with grad) is exactly
        the rollout policy's forward, so it also yields the old log-probs and values (steps 3-4) and is not
        run twice. Ratios are then exactly 1 in epoch 1, as the PPO math has them."""
        return (
            self.policy_args.num_minibatches == 1
            and self.cfg.optim.gradient_accumulation_steps == 1
            and self.policy_args.ppo_epochs > 0
            and self.cfg.lora.lora_dropout == 0
        )

    @property
    def value_pass_apart(self) -> bool:
        """``--value-pass-apart`` with a separate value model (not a head on the policy) in one process: each
        update runs the policy's forward and backward first, then the value model's, in micro-batches a quarter
        the size (``VALUE_PASS_SPLIT``), so the two networks' activations are never held at once (on
        SmolLM2-135M over 1 GB of a full PPO step's peak; quarter-size value micro-batches hold 0.2 GB less than
        half-size ones, for ~2% more time). The gradients are those of the joint loss: the two networks share no
        parameters. Where the first pass is reused, the value model's part of epoch 1 runs in the rollout
        (``value_pass_early``). Several processes keep the joint pass (their gradient sync expects one backward
        per micro-batch)."""
        module = self.accelerator.unwrap_model(self.actor_critic)
        return (
            self.critic_args is not None
            and self.critic_args.value_pass_apart
            and module.value_model is not None
            and engines.engine(self.accelerator) == "single"
        )

    @property
    def value_pass_early(self) -> bool:
        """The value model's pass apart where the first pass is reused, with a built-in critic estimator (whose
        returns are per row): its epoch-1 forward and backward run in the rollout, a quarter of the rows at a
        time (``value_pass_first``), so the value model runs forward once a step instead of twice (a forward
        without gradients for the rollout's values, another with them in the update): epoch 1's minibatch is the
        whole rollout and the parameters have not moved, so that forward's values are the old values.
        Its gradients are then held from the rollout to the update's step (the size of its parameters, less the
        input embedding's: sparse until the step, ``updates.sparse_embedding_grads``)."""
        return self.value_pass_apart and self.reuses_first_pass and self.adv_args.advantage in CRITIC_ESTIMATORS

    def value_pass_first(self, r: Rollout) -> tuple[Rollout, dict, float]:
        """``value_pass_early``: the value model's forward and backward of epoch 1 on rollout ``r`` (values
        still unset), ``VALUE_PASS_SPLIT`` chunks of rows, each chunk's returns from its own values as the
        estimator gives them (per row), its value loss scaled by its share of the batch's loss units as in
        ``train_epochs``. Returns ``r`` with its values, the value loss terms' stats (scaled the same way) and
        the seconds its backward passes took (update work, timed as such)."""
        mask = r.action_mask.float()
        # the per-token rewards and the loss mask (the values only enter the estimator)
        plan = self.credit(replace(r, values=torch.zeros_like(mask)), {})
        units = self.units(plan.loss_mask)
        B = mask.shape[0]
        size = value_chunk_rows(B)
        values, totals, backward_s = [], {}, 0.0
        for start in range(0, B, size):
            chunk = plan.select(torch.arange(start, min(start + size, B), device=self.device))
            ids, attn, chunk_mask = chunk.input_ids, chunk.attention_mask, chunk.action_mask.float()
            with torch.enable_grad(), self.accelerator.autocast():
                packed = self.packed(ids, attn, chunk.query_ids.shape[1])
                v = self.actor_critic(ids, attn, chunk.n_response, packed=packed, part="value")[1] * chunk_mask
                old = v.detach()
                _, returns = self.estimate(chunk.rewards, chunk_mask, old)
                loss, stats = self.value_term(v, replace(chunk, values=old, returns=returns), chunk.loss_mask.float())
                share = self.share(chunk, units)
                start_backward = time.perf_counter()
                self.accelerator.backward(loss * share)
                backward_s += time.perf_counter() - start_backward
            values.append(old)
            for key, value in {"loss/total": loss, **stats}.items():
                totals[key] = totals.get(key, 0.0) + float(value.detach()) * share
        return replace(r, values=torch.cat(values)), totals, backward_s

    def sample(self, batch: PromptBatch, metrics: dict) -> tuple[dict, RewardBatch]:
        """Step 1: one reply per prompt, or (multi-turn) one conversation per prompt. Returns the rollout's
        tensors (``conversation_tensors``' keys; single-turn: the action mask is the response mask and there
        are no turn rewards) and what the rewards read of them."""
        if self.multiturn is None:
            query_ids, query_mask, response_ids, response_mask, finished = generate(
                self.policy, self.tokenizer, batch.prompt_ids, self.gen, self.device
            )
            texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
            ids = [row[: int(n)] for row, n in zip(response_ids.tolist(), response_mask.sum(dim=1).tolist())]
            tensors = {
                "query_ids": query_ids,
                "query_mask": query_mask,
                "response_ids": response_ids,
                "response_mask": response_mask,
                "action_mask": response_mask,
                "turn_rewards": torch.zeros_like(response_mask, dtype=torch.float),
            }
            return tensors, RewardBatch(batch.prompts, texts, ids, finished, batch.columns, batch.rows)
        convs = self.multiturn.rollout(self.policy, batch.prompts, batch.rows, batch.columns, self.gen, self.device)
        metrics.update(conversation_metrics(convs))
        self.last_messages = [c.messages for c in convs]
        tensors = conversation_tensors(convs, self.tokenizer.pad_token_id, self.rewards.env_weight, self.device)
        # the last reply is the completion, the conversation before it the prompt
        reward_batch = RewardBatch(
            [c.messages[:-1] for c in convs],
            [c.reply for c in convs],
            [c.reply_ids for c in convs],
            [c.finished for c in convs],
            batch.columns,
            batch.rows,
            messages=[c.messages for c in convs],
            env_rewards=[c.env_reward for c in convs],
            openings=[c.opening for c in convs],
            conversation_ids=[c.ids for c in convs],
        )
        return tensors, reward_batch

    @torch.no_grad()
    def make_rollout(self, batch: PromptBatch) -> tuple[Rollout, Rollout, tuple | None, dict | None, dict]:
        """Steps 1-6 for a batch of prompts, each already repeated G times (rows of a group contiguous).
        Returns this process's rollout, every process's (``gather_rollout``), the first epoch's forward outputs
        when they are reused (``reuses_first_pass``; else None), the value loss stats of the value model's
        epoch-1 pass when it ran here (``value_pass_early``; else None), and metrics of the step so far
        (timings, reward components, zero-std groups)."""
        metrics: dict[str, float] = {}
        step_start = phase_start = time.perf_counter()
        # 1. Generate (multi-turn: play the conversations, tools and environment answering between replies).
        self.actor_critic.eval()
        with engines.gathered_for_generation(self.accelerator, self.actor_critic):
            t, reward_batch = self.sample(batch, metrics)
        query_ids, query_mask, response_ids, response_mask = (
            t["query_ids"], t["query_mask"], t["response_ids"], t["response_mask"]
        )  # fmt: skip
        action_mask, turn_rewards, finished = t["action_mask"], t["turn_rewards"], reward_batch.finished
        if not self.reuses_freed_memory:
            release_freed_memory()  # the sampler's buffers
        metrics["time/generate_s"] = time.perf_counter() - phase_start
        # 2. Reward.
        phase_start = time.perf_counter()
        reward = self.rewards(reward_batch)
        scores, valid = reward.total.to(self.device).float(), reward.valid.to(self.device)
        components = {k: gather_rows(self.accelerator, v.to(self.device)) for k, v in reward.components.items()}
        metrics["time/score_s"] = time.perf_counter() - phase_start
        # 3-4. Old log-probs and values (one pass), reference log-probs.
        phase_start = time.perf_counter()
        input_ids = torch.cat([query_ids, response_ids], 1)
        attn = torch.cat([query_mask, response_mask], 1)
        T = response_ids.shape[1]
        first_pass = None
        with self.accelerator.autocast():
            packed = self.packed(input_ids, attn, query_ids.shape[1])
            if self.reuses_first_pass:
                self.actor_critic.train()
                part = "policy" if self.value_pass_apart else "both"
                with torch.enable_grad():
                    first_pass = self.actor_critic(
                        input_ids, attn, T, self.gen.temperature, True, packed=packed, part=part
                    )
                logprobs, values = first_pass[0].detach(), _detach(first_pass[1])
                if part == "policy" and not self.value_pass_early:
                    values = self.actor_critic(input_ids, attn, T, packed=packed, part="value")[1]
            else:
                logprobs, values, _ = self.actor_critic(input_ids, attn, T, self.gen.temperature, packed=packed)
            ref_logprobs = self.reference_logprobs(input_ids, attn, T, packed) if self.has_reference else None
        mask = action_mask.float()
        logprobs = logprobs * mask
        ref_logprobs = ref_logprobs * mask if ref_logprobs is not None else None
        values = values * mask if values is not None else None
        local = Rollout(
            query_ids=query_ids,
            query_mask=query_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            action_mask=action_mask,
            loss_mask=action_mask,  # set with the advantages below
            group_ids=torch.tensor(batch.group_ids, device=self.device),
            scores=scores,
            raw_scores=reward.score.to(self.device),
            valid=valid,
            finished=torch.tensor(finished, device=self.device),
            logprobs=logprobs,
            ref_logprobs=ref_logprobs,
            values=values,
            turn_rewards=turn_rewards,
            rewards=torch.zeros_like(mask),  # rewards, advantages, returns: below
            advantages=torch.zeros_like(mask),
            returns=torch.zeros_like(mask),
        )
        value_stats, value_backward_s = None, 0.0
        if first_pass is not None and self.value_pass_early:
            local, value_stats, value_backward_s = self.value_pass_first(local)
            metrics["time/update_s"] = value_backward_s  # the update's work, done here
        metrics["time/forward_s"] = time.perf_counter() - phase_start - value_backward_s
        # Steps 5-6 need the whole batch (group and batch statistics, whitening): with several processes every
        # rank gathers every rank's rows and computes them exactly as one process would, then keeps its own.
        everyone = self.credit(gather_rollout(self.accelerator, local, self.tokenizer.pad_token_id), metrics)
        metrics.update(self.reward_metrics(components, everyone.valid))
        rows = torch.arange(len(batch.rows), device=self.device) + self.session.ranks.rank * len(batch.rows)
        mine = everyone.select(rows)
        T = response_ids.shape[1]  # this process's response width; the gathered batch may be wider
        rollout = replace(
            local,
            loss_mask=mine.loss_mask[:, :T],
            scores=mine.scores,
            rewards=mine.rewards[:, :T],
            advantages=mine.advantages[:, :T],
            returns=mine.returns[:, :T],
        )
        metrics["time/rollout_s"] = time.perf_counter() - step_start
        return rollout, everyone, first_pass, value_stats, metrics

    def credit(self, r: Rollout, metrics: dict) -> Rollout:
        """Steps 5-6 on a whole batch: per-token rewards, advantages, returns and the loss mask. Only the
        policy's tokens (``action_mask``) take part: in a multi-turn rollout the estimators see its replies as
        one sequence, the tool and environment tokens between them left out."""
        mask = r.action_mask.float()
        valid, scores = r.valid, r.scores
        # 5. Per-token rewards: the reward at the last real token, minus beta*KL_t when the KL is in the reward.
        # An environment's per-turn rewards sit at their turns' last tokens and the rest of the score at the last.
        G = self.adv_args.num_generations
        if G > 1:
            scores = fill_invalid_from_group(scores, valid, G)  # rows no reward applies to: the group mean
        early = r.turn_rewards * valid.unsqueeze(1).to(r.turn_rewards.dtype)
        last = scores - early.sum(dim=1)
        if self.kl_in_reward:
            kl = ops.kl_penalty(r.logprobs, r.ref_logprobs, self.kl_args.kl_estimator) * mask
            rewards = ops.per_token_rewards(last, kl, mask, self.kl_ctl.value) + early
        else:
            rewards = ops.per_token_rewards(last, torch.zeros_like(mask), mask, 0.0) + early
        # 6. Advantages.
        advantages, returns = self.estimate(rewards, mask, r.values)
        if self.adv_args.whiten_advantages and self.adv_args.advantage in CRITIC_ESTIMATORS:
            advantages = ops.masked_whiten(advantages, mask) * mask
        loss_mask = self.loss_mask(r.action_mask, r.finished, scores, valid, metrics)
        advantages = advantages * valid.unsqueeze(1).to(advantages.dtype)  # no reward applies: advantage 0
        return replace(r, loss_mask=loss_mask, scores=scores, rewards=rewards, advantages=advantages, returns=returns)

    def estimate(self, rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None) -> tuple:
        """Step 6's estimator on ``[b, T]`` per-token rewards: (advantages, returns), on the policy's tokens
        ``mask`` only (``action_order``)."""
        estimator = ops.get_advantage_estimator(self.adv_args.advantage)
        order = action_order(mask)
        if order is None:
            return estimator(rewards, mask, self.advantage_config, values)
        values = values.gather(1, order) if values is not None else None
        compact = estimator(rewards.gather(1, order), mask.gather(1, order), self.advantage_config, values)
        return tuple(torch.zeros_like(x).scatter(1, order, x) for x in compact)

    def reward_metrics(self, components: dict[str, torch.Tensor], valid: torch.Tensor) -> dict[str, float]:
        """``reward/<name>`` of each component when there are several (mean where it applies), and the share
        of completions no reward applied to."""
        out: dict[str, float] = {}
        if len(components) > 1 or self.cfg.algorithm != "ppo":
            for name, values in components.items():
                applies = ~torch.isnan(values)
                out[f"reward/{name}"] = float(values[applies].mean()) if applies.any() else math.nan
        if not bool(valid.all()):
            out["reward/unscored_fraction"] = float((~valid).float().mean())
        return out

    def loss_mask(self, action_mask, finished, scores, valid, metrics: dict) -> torch.Tensor:
        """``[B, T]`` the tokens that get a gradient: the policy's, less the rows left out of the update
        (no reward applies; cut off with --mask-truncated-completions; a zero-std group with
        --drop-zero-std-groups). Also counts the zero-std groups into ``metrics``."""
        keep = valid.clone()
        if self.policy_args.mask_truncated_completions:
            keep &= finished
        G = self.adv_args.num_generations
        if G > 1 and self.adv_args.advantage in GROUP_ESTIMATORS:
            groups = scores.view(-1, G)
            flat = (groups.max(dim=1).values - groups.min(dim=1).values) == 0  # [B / G]
            metrics["rollout/zero_std_groups"] = float(flat.sum())
            if self.adv_args.drop_zero_std_groups:
                keep &= ~flat.repeat_interleave(G)
        if bool(keep.all()):
            return action_mask
        return action_mask * keep.unsqueeze(1).to(action_mask.dtype)

    # ---- step 7: epochs over minibatches ---------------------------------------------------------
    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A token loss ``[B, T]`` -> scalar by --loss-aggregation (token-mean: the masked mean)."""
        mode = self.policy_args.loss_aggregation
        if mode == "token-mean":
            return ops.masked_mean(per_token, mask)
        return ops.aggregate_loss(per_token, mask, mode, max_len=self.max_tokens)

    def loss(self, mb: Rollout, outputs: tuple | None = None, part: str = "both") -> tuple[torch.Tensor, dict]:
        """The loss of one (micro-)batch: L = L_clip + c1*L_V - c2*H (+ beta*KL in the loss) (+ c3*KL_ref).

        ``outputs``: this batch's (log-probs, values, entropy) from a forward already run with grad. ``part``:
        "policy" (every term but c1*L_V) or "value" (c1*L_V alone) with a separate value model, else "both"."""
        mask = mb.loss_mask.float()
        if outputs is None:
            input_ids, attn = mb.input_ids, mb.attention_mask
            packed = self.packed(input_ids, attn, mb.query_ids.shape[1])
            outputs = self.actor_critic(
                input_ids, attn, mb.n_response, self.gen.temperature, True, packed=packed, part=part
            )
        logprobs, values, entropy = outputs
        if part == "value":
            loss, stats = self.value_term(values, mb, mask)
            return loss, {k: float(v.detach()) for k, v in {"loss/total": loss, **stats}.items()}
        p = self.policy_args
        surrogate = ops.ppo_policy_loss_per_token if p.importance_ratio == "token" else ops.sequence_ratio_policy_loss
        per_token, pg_stats = surrogate(
            logprobs, mb.logprobs, mb.advantages, mask, p.clip_eps, clip_eps_high=p.clip_eps_high
        )
        pg_loss = self.aggregate(per_token, mask)
        stats = {"loss/policy": pg_loss}
        loss = pg_loss
        if self.critic_args is not None and part == "both":
            vf_term, vf_stats = self.value_term(values, mb, mask)
            loss = loss + vf_term
            stats.update(vf_stats)
        ent = self.aggregate(entropy, mask)
        loss = loss - p.entropy_coef * ent
        if self.kl_args.kl_in_loss and self.has_reference:
            kl_loss = self.aggregate(ops.kl_penalty(logprobs, mb.ref_logprobs, "k3"), mask)
            loss = loss + self.kl_ctl.value * kl_loss
            stats["loss/kl"] = kl_loss
        if self.kl_args.kl_loss_coef > 0:
            kl_ref = ops.masked_mean(ops.kl_penalty(logprobs, mb.ref_logprobs, "k3"), mask)
            loss = loss + self.kl_args.kl_loss_coef * kl_ref
        stats.update(
            {
                "loss/total": loss,
                "policy/entropy": ent,
                "policy/clipfrac": pg_stats["clipfrac"],
                "policy/approx_kl": pg_stats["approx_kl"],
            }
        )
        return loss, {k: float(v.detach()) for k, v in stats.items()}

    def value_term(self, values: torch.Tensor, mb: Rollout, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """c1*L_V of one (micro-)batch, and its stats (the value loss, its clip fraction)."""
        vf_loss, vf_stats = ops.value_loss(values, mb.values, mb.returns, mask, self.critic_args.value_clip)
        return self.critic_args.vf_coef * vf_loss, {"loss/value": vf_loss, "value/clipfrac": vf_stats["clipfrac"]}

    def units(self, loss_mask: torch.Tensor) -> float:
        """The loss units of rows with ``loss_mask`` ``[b, T]``: tokens for token-mean, non-empty rows for
        seq-mean-token-mean, rows for the other per-sequence aggregations."""
        if self.policy_args.loss_aggregation == "token-mean":
            return float(loss_mask.sum())
        if self.policy_args.loss_aggregation == "seq-mean-token-mean":
            return float((loss_mask.sum(dim=1) > 0).sum())
        return float(loss_mask.shape[0])

    def share(self, micro: Rollout, minibatch_units: float) -> float:
        """A micro-batch's share of its minibatch's loss, so that accumulation, and the gradient averaging
        over processes, give exactly the loss of the whole minibatch: its units over the minibatch's units on
        all processes, times the number of processes (which the averaging divides out). A value loss (a
        token mean) under a per-sequence aggregation is weighted by rows too."""
        return self.units(micro.loss_mask) * self.accelerator.num_processes / max(minibatch_units, 1.0)

    def train_epochs(self, rollout: Rollout, first_pass: tuple | None = None, value_stats: dict | None = None) -> dict:
        """Epochs over shuffled minibatches. ``first_pass``: the whole rollout's forward outputs
        (``reuses_first_pass``), which stand in for epoch 1's forward of its single minibatch; ``value_stats``:
        the value loss stats of that minibatch's value pass, already run with the rollout (``value_pass_early``:
        its gradients are in place)."""
        B = rollout.scores.shape[0]
        mb_size = B // self.policy_args.num_minibatches
        micro_size = mb_size // self.cfg.optim.gradient_accumulation_steps
        sums: dict[str, float] = {}
        n = 0
        apart = self.value_pass_apart
        self.actor_critic.train()
        for epoch in range(self.policy_args.ppo_epochs):
            order = torch.randperm(B, generator=self.shuffle)
            reuse = epoch == 0 and first_pass is not None
            for start in range(0, B, mb_size):
                mb_index = order[start : start + mb_size]
                mb_units = reduce_sum(self.accelerator, self.units(rollout.loss_mask[mb_index]))
                micro = [
                    rollout.select(mb_index[i : i + micro_size].to(self.device)) for i in range(0, mb_size, micro_size)
                ]

                def loss_fn(mb: Rollout, part: str = "policy" if apart else "both"):
                    outputs = (
                        tuple(_select(o, mb_index) for o in first_pass) if reuse and part != "value" else None
                    )  # rows in minibatch order
                    loss, stats = self.loss(mb, outputs, part)
                    share = self.share(mb, mb_units)
                    return loss * share, {k: v * share for k, v in stats.items()}

                stats = updates.accumulate(self.accelerator, self.actor_critic, micro, loss_fn)
                if apart:  # then the value model's pass, in micro-batches a quarter the size
                    if reuse and value_stats is not None:  # run with the rollout already
                        value_part = value_stats
                    else:
                        part = value_chunk_rows(micro_size)
                        chunks = [
                            rollout.select(mb_index[i : i + part].to(self.device)) for i in range(0, mb_size, part)
                        ]
                        value_part = updates.accumulate(
                            self.accelerator, self.actor_critic, chunks, lambda mb: loss_fn(mb, "value")
                        )
                    for key, value in value_part.items():
                        stats[key] = stats.get(key, 0.0) + value
                if any_rank(self.accelerator, not math.isfinite(stats["loss/total"])):
                    self.optimizer.zero_grad(set_to_none=True)
                    return {"non_finite": 1.0}
                stats["grad_norm"] = updates.step(
                    self.accelerator, self.actor_critic, self.optimizer, self.scheduler, self.cfg.optim.max_grad_norm
                )
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + value
                n += 1
        return {k: v / n for k, v in sums.items()}

    def step(self, batch: PromptBatch) -> dict:
        """Steps 1-8 on one batch of prompts (repeated G times); returns the step's metrics (with the rollout
        under ``"_rollout"``), or {} when a non-finite reward or loss made the step skip its update."""
        step_start = time.perf_counter()
        # the rate this step's first update uses (as the other trainers log it: the rate of the step, not the next)
        learning_rate = self.scheduler.get_last_lr()[0]
        rollout, everyone, first_pass, value_stats, metrics = self.make_rollout(batch)
        if not torch.isfinite(everyone.rewards).all() or not torch.isfinite(everyone.advantages).all():
            self.optimizer.zero_grad(set_to_none=True)  # a value pass in the rollout left its gradients
            return self._skip("reward")
        if not self.reuses_freed_memory:
            release_freed_memory()  # the teacher-forced passes' activations (all but a reused first pass's)
        phase_start = time.perf_counter()
        train_stats = self.train_epochs(rollout, first_pass, value_stats)
        del first_pass
        if "non_finite" in train_stats:
            return self._skip("loss")
        self.bad_steps = 0
        metrics["time/update_s"] = metrics.get("time/update_s", 0.0) + time.perf_counter() - phase_start
        # 8. Control and log: the experience metrics and beta's update come from the whole batch (the same on
        # every process); the loss terms and timings are averaged over processes.
        metrics = reduce_mean(self.accelerator, {**metrics, **train_stats})
        metrics = {**rollout_metrics(everyone, self.kl_ctl.value), **metrics}
        if self.has_reference:
            self.kl_ctl.update(metrics["kl/ref"], n_steps=everyone.scores.shape[0])
        metrics["learning_rate"] = learning_rate
        metrics["time/step_s"] = time.perf_counter() - step_start
        metrics["_rollout"] = everyone
        return metrics

    def _skip(self, what: str) -> dict:
        self.bad_steps += 1
        self.session.logger.write(f"warning: non-finite {what}; this update was skipped")
        if self.bad_steps >= MAX_BAD_UPDATES:
            raise UserError(
                f"{self.cfg.algorithm}: {MAX_BAD_UPDATES} non-finite updates in a row; stopping "
                f"(try a lower {option('learning_rate')}, {option('reward_clip')}, or check the rewards)"
            )
        return {}

    def refresh_reference(self) -> None:
        """Copy the current policy into the frozen reference (an optional step of the loop: the KL penalty then
        measures the drift from a recent policy rather than from the start)."""
        self.ref_model.load_state_dict(self.policy.state_dict())

    # ---- checkpoints ---------------------------------------------------------------------------
    def checkpoint_models(self) -> dict:
        models = {"actor_critic": self.actor_critic}
        if self.kl_args.ref_update_steps and self.ref_model is not None:
            models["reference"] = self.ref_model
        return models

    def state_dict(self, stream: IndexStream) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "kl_controller": self.kl_ctl.state_dict(),
            "stream": stream.state_dict(),
            "shuffle": self.shuffle.get_state(),
        }

    def load_state_dict(self, state: dict, stream: IndexStream) -> None:
        if "optimizer" in state:  # a sharding engine restored it with the model
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.kl_ctl.load_state_dict(state["kl_controller"])
        stream.load_state_dict(state["stream"])
        self.shuffle.set_state(state["shuffle"])


class PromptBatch:
    """One step's prompts, each repeated G times (``--num-generations``) so a group's rows are contiguous.

    prompts, prompt_ids: ``[B]`` prompt (text or messages) and its token ids; rows: the 0-based data row of
    each; columns: the rows' other fields as lists aligned with ``prompts``; group_ids: ``[B]`` the group of
    each row (rows ``[k*G, (k+1)*G)`` form group ``first_group + k``; with several processes the groups are
    numbered over the whole step)."""

    def __init__(
        self, examples: list, prompt_ids: list[list[int]], index: list[int], group_size: int, first_group: int = 0
    ):
        self.rows = [i for i in index for _ in range(group_size)]
        self.prompts = [examples[i].prompt for i in self.rows]
        self.prompt_ids = [prompt_ids[i] for i in self.rows]
        names = list(dict.fromkeys(k for i in index for k in examples[i].extra))
        self.columns = {name: [examples[i].extra.get(name) for i in self.rows] for name in names}
        self.group_ids = [first_group + k for k in range(len(index)) for _ in range(group_size)]


def fill_invalid_from_group(scores: torch.Tensor, valid: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]`` scores with each row that no reward applies to replaced by its group's mean over the rows one
    applies to (0 when none does), so it moves no baseline; its advantage is then set to 0."""
    if bool(valid.all()):
        return scores
    groups, ok = scores.view(-1, group_size), valid.view(-1, group_size).to(scores.dtype)
    means = (groups * ok).sum(dim=1, keepdim=True) / ok.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.where(ok.bool(), groups, means).view(-1)


def _detach(x: torch.Tensor | None) -> torch.Tensor | None:
    return x.detach() if x is not None else None


def _select(x: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    return x[index.to(x.device)] if x is not None else None
