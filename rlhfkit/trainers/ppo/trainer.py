"""`rlhfkit ppo`: RLHF PPO against a reward model with a KL penalty to a frozen reference.

One PPO step (``ppo_step``) is the loop of the RLHF literature:
  1. generate responses with the current policy
  2. score them with the reward model
  3. log-probs under the rollout ("old") policy and the frozen reference
  4. values from the value function (same forward pass as 3 for a value head)
  5. per-token rewards r_t = -beta*KL_t, plus the score at the last real token
  6. advantages (GAE or sequence-level), whitened
  7. PPO epochs over minibatches: clipped surrogate + c1*value loss - c2*entropy (+ c3*KL)
  8. update beta, log, write samples
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import replace

import torch

from rlhfkit import ops
from rlhfkit.accel.packing import PackedBatch, can_pack, pack_batch
from rlhfkit.config.commands import PPOConfig
from rlhfkit.data.encode import encode_prompt
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError
from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.loading import load_causal_lm, load_reward_model, load_tokenizer
from rlhfkit.models.lora import adapters_off, apply_lora
from rlhfkit.models.reward import RewardScorer
from rlhfkit.trainers.ppo.monitor import HackingMonitor
from rlhfkit.trainers.ppo.policy import ActorCritic, SeparateValueModel
from rlhfkit.trainers.ppo.reporting import GoldEvaluator, SampleWriter, rollout_metrics
from rlhfkit.trainers.ppo.rollout import Rollout, generate
from rlhfkit.trainers.ppo.scoring import shape_scores
from rlhfkit.training import updates
from rlhfkit.training.runtime import disable_dropout
from rlhfkit.training.session import open_session
from rlhfkit.training.stream import IndexStream

MAX_BAD_UPDATES = 3  # consecutive non-finite steps before the run stops


class PPOTrainer:
    """Holds the four roles and runs ``ppo_step``. Built by ``train(cfg)``; usable from Python too."""

    def __init__(self, cfg: PPOConfig, actor_critic: ActorCritic, ref_model, scorer: RewardScorer, tokenizer, session):
        self.cfg, self.ppo, self.gen = cfg, cfg.ppo, cfg.generation
        self.actor_critic, self.ref_model, self.scorer = actor_critic, ref_model, scorer
        self.tokenizer, self.session = tokenizer, session
        self.accelerator = session.accelerator
        self.device = session.device
        self.kl_ctl = (
            ops.AdaptiveKLController(self.ppo.kl_coef, self.ppo.target_kl, self.ppo.kl_horizon)
            if self.ppo.target_kl is not None
            else ops.FixedKLController(self.ppo.kl_coef)
        )
        self.updates_per_step = self.ppo.ppo_epochs * self.ppo.num_minibatches
        optim_args = replace(cfg.optim, warmup_steps=cfg.optim.warmup_steps * self.updates_per_step)
        self.optimizer = updates.build_optimizer(self.actor_critic, optim_args)
        self.scheduler = updates.build_scheduler(
            self.optimizer, optim_args, session.total_steps * self.updates_per_step
        )
        self.actor_critic, self.optimizer = self.accelerator.prepare(self.actor_critic, self.optimizer)
        self.shuffle = torch.Generator().manual_seed(cfg.run.seed)  # minibatch order
        self.bad_steps = 0
        value = actor_critic.value_model
        models = [self.policy, self.ref_model, value.backbone if value is not None else None]
        self.pack_sequences = cfg.packing.pack_sequences and all(can_pack(m) for m in models if m is not None)

    @property
    def policy(self):
        return self.accelerator.unwrap_model(self.actor_critic).policy

    def packed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedBatch | None:
        """The batch packed for the teacher-forced passes (``--pack-sequences``), or None to run it padded."""
        return (
            pack_batch(self.policy, input_ids, attention_mask, self.tokenizer.pad_token_id)
            if self.pack_sequences
            else None
        )

    # ---- steps 1-6: experience -------------------------------------------------------------
    @property
    def reuses_first_pass(self) -> bool:
        """One minibatch, no accumulation, no dropout: the first PPO epoch's forward pass (with grad) is
        exactly the rollout policy's forward, so it also yields the old log-probs and values (step 3-4)
        and is not run twice. Ratios are then exactly 1 in epoch 1, as the PPO math has them."""
        return (
            self.ppo.num_minibatches == 1
            and self.cfg.optim.gradient_accumulation_steps == 1
            and self.ppo.ppo_epochs > 0
            and self.cfg.lora.lora_dropout == 0
        )

    @torch.no_grad()
    def make_rollout(self, prompts: list, prompt_ids: list[list[int]]) -> tuple[Rollout, tuple | None, dict]:
        """Steps 1-6. Returns the rollout, the first epoch's forward outputs when they are reused
        (``reuses_first_pass``; else None), and timings."""
        timings = {}
        step_start = phase_start = time.perf_counter()
        eos = self.tokenizer.eos_token_id
        # 1. Generate.
        self.actor_critic.eval()
        query_ids, query_mask, response_ids, response_mask, finished = generate(
            self.policy, self.tokenizer, prompt_ids, self.gen, self.device
        )
        timings["time/generate_s"] = time.perf_counter() - phase_start
        # 2. Score.
        phase_start = time.perf_counter()
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        out = self.scorer.score(prompts, texts, finished=finished)
        raw = out.mean.to(self.device).float()
        scores = shape_scores(
            out, response_mask, self.ppo, self.scorer.stats, self.scorer.conservative_k, eos, response_ids
        )
        timings["time/score_s"] = time.perf_counter() - phase_start
        # 3-4. Old log-probs and values (one pass), reference log-probs.
        phase_start = time.perf_counter()
        input_ids = torch.cat([query_ids, response_ids], 1)
        attn = torch.cat([query_mask, response_mask], 1)
        T = response_ids.shape[1]
        first_pass = None
        with self.accelerator.autocast():
            packed = self.packed(input_ids, attn)
            if self.reuses_first_pass:
                self.actor_critic.train()
                with torch.enable_grad():
                    first_pass = self.actor_critic(input_ids, attn, T, self.gen.temperature, True, packed=packed)
                logprobs, values = first_pass[0].detach(), first_pass[1].detach()
            else:
                logprobs, values, _ = self.actor_critic(input_ids, attn, T, self.gen.temperature, packed=packed)
            if self.ref_model is None:  # LoRA: the reference is the same backbone with adapters off
                with adapters_off(self.policy):
                    ref_logprobs = response_logprobs(self.policy, input_ids, attn, T, self.gen.temperature, packed)
            else:
                ref_logprobs = response_logprobs(self.ref_model, input_ids, attn, T, self.gen.temperature, packed)
        mask = response_mask.float()
        logprobs, ref_logprobs, values = logprobs * mask, ref_logprobs * mask, values * mask
        timings["time/forward_s"] = time.perf_counter() - phase_start
        # 5. KL-penalised per-token rewards.
        kl = ops.kl_penalty(logprobs, ref_logprobs, self.ppo.kl_estimator) * mask
        rewards = ops.per_token_rewards(scores, kl, mask, self.kl_ctl.value)
        # 6. Advantages.
        if self.ppo.advantage == "gae":
            advantages, returns = ops.gae(rewards, values, mask, self.ppo.gamma, self.ppo.lam)
        else:
            advantages, returns = ops.sequence_advantage(rewards, values, mask)
        if self.ppo.whiten_advantages:
            advantages = ops.masked_whiten(advantages, mask) * mask
        rollout = Rollout(
            query_ids,
            query_mask,
            response_ids,
            response_mask,
            scores,
            raw,
            logprobs,
            ref_logprobs,
            values,
            rewards,
            advantages,
            returns,
        )
        timings["time/rollout_s"] = time.perf_counter() - step_start
        return rollout, first_pass, timings

    # ---- step 7: PPO epochs -------------------------------------------------------------------
    def loss(self, mb: Rollout, outputs: tuple | None = None) -> tuple[torch.Tensor, dict]:
        """The combined PPO loss of one (micro-)batch: L = L_clip + c1*L_V - c2*H (+ c3*KL_ref).

        ``outputs``: this batch's (log-probs, values, entropy) from a forward already run with grad."""
        mask = mb.response_mask.float()
        if outputs is None:
            input_ids, attn = mb.input_ids, mb.attention_mask
            outputs = self.actor_critic(
                input_ids, attn, mb.n_response, self.gen.temperature, True, packed=self.packed(input_ids, attn)
            )
        logprobs, values, entropy = outputs
        pg_loss, pg_stats = ops.ppo_policy_loss(logprobs, mb.logprobs, mb.advantages, mask, self.ppo.clip_eps)
        vf_loss, vf_stats = ops.value_loss(values, mb.values, mb.returns, mask, self.ppo.value_clip)
        ent = ops.masked_mean(entropy, mask)
        loss = pg_loss + self.ppo.vf_coef * vf_loss - self.ppo.entropy_coef * ent
        if self.ppo.kl_loss_coef > 0:
            kl_ref = ops.masked_mean(ops.kl_penalty(logprobs, mb.ref_logprobs, "k3"), mask)
            loss = loss + self.ppo.kl_loss_coef * kl_ref
        stats = {
            "loss/policy": pg_loss,
            "loss/value": vf_loss,
            "loss/total": loss,
            "policy/entropy": ent,
            "policy/clipfrac": pg_stats["clipfrac"],
            "policy/approx_kl": pg_stats["approx_kl"],
            "value/clipfrac": vf_stats["clipfrac"],
        }
        return loss, {k: float(v.detach()) for k, v in stats.items()}

    def train_epochs(self, rollout: Rollout, first_pass: tuple | None = None) -> dict:
        """PPO epochs over shuffled minibatches. ``first_pass``: the whole rollout's forward outputs
        (``reuses_first_pass``), which stand in for epoch 1's forward of its single minibatch."""
        B = rollout.scores.shape[0]
        mb_size = B // self.ppo.num_minibatches
        micro_size = mb_size // self.cfg.optim.gradient_accumulation_steps
        sums: dict[str, float] = {}
        n = 0
        self.actor_critic.train()
        for epoch in range(self.ppo.ppo_epochs):
            order = torch.randperm(B, generator=self.shuffle)
            reuse = epoch == 0 and first_pass is not None
            for start in range(0, B, mb_size):
                mb_index = order[start : start + mb_size]
                mb_tokens = float(rollout.response_mask[mb_index].sum())
                micro = [
                    rollout.select(mb_index[i : i + micro_size].to(self.device)) for i in range(0, mb_size, micro_size)
                ]

                def loss_fn(mb: Rollout):
                    outputs = (
                        tuple(o[mb_index.to(o.device)] for o in first_pass) if reuse else None
                    )  # rows in minibatch order
                    loss, stats = self.loss(mb, outputs)
                    share = float(mb.response_mask.sum()) / max(mb_tokens, 1.0)  # token share: exact accumulation
                    return loss * share, {k: v * share for k, v in stats.items()}

                stats = updates.accumulate(self.accelerator, self.actor_critic, micro, loss_fn)
                if not math.isfinite(stats["loss/total"]):
                    self.optimizer.zero_grad(set_to_none=True)
                    return {"non_finite": 1.0}
                stats["grad_norm"] = updates.step(
                    self.accelerator, self.actor_critic, self.optimizer, self.scheduler, self.cfg.optim.max_grad_norm
                )
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + value
                n += 1
        return {k: v / n for k, v in sums.items()}

    def ppo_step(self, prompts: list, prompt_ids: list[list[int]]) -> dict:
        step_start = time.perf_counter()
        rollout, first_pass, timings = self.make_rollout(prompts, prompt_ids)
        if not torch.isfinite(rollout.rewards).all() or not torch.isfinite(rollout.advantages).all():
            return self._skip("reward")
        phase_start = time.perf_counter()
        train_stats = self.train_epochs(rollout, first_pass)
        del first_pass
        if "non_finite" in train_stats:
            return self._skip("loss")
        self.bad_steps = 0
        timings["time/update_s"] = time.perf_counter() - phase_start
        # 8. Control and log.
        metrics = rollout_metrics(rollout, self.kl_ctl.value)
        self.kl_ctl.update(metrics["kl/ref"], n_steps=rollout.scores.shape[0])
        metrics.update(train_stats)
        metrics.update(timings)
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        metrics["time/step_s"] = time.perf_counter() - step_start
        metrics["_rollout"] = rollout
        return metrics

    def _skip(self, what: str) -> dict:
        self.bad_steps += 1
        self.session.logger.write(f"warning: non-finite {what}; this PPO update was skipped")
        if self.bad_steps >= MAX_BAD_UPDATES:
            raise UserError(
                f"ppo: {MAX_BAD_UPDATES} non-finite updates in a row; stopping "
                "(try a lower --learning-rate, --reward-clip, or check the reward model)"
            )
        return {}

    def refresh_reference(self) -> None:
        """Copy the current policy into the frozen reference (an optional step of the loop: the KL penalty then
        measures the drift from a recent policy rather than from the start)."""
        self.ref_model.load_state_dict(self.policy.state_dict())

    # ---- checkpoints ---------------------------------------------------------------------------
    def checkpoint_models(self) -> dict:
        models = {"actor_critic": self.actor_critic}
        if self.ppo.ref_update_steps and self.ref_model is not None:
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
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.kl_ctl.load_state_dict(state["kl_controller"])
        stream.load_state_dict(state["stream"])
        self.shuffle.set_state(state["shuffle"])


def build_models(cfg: PPOConfig, tokenizer):
    """Policy (+LoRA), value function, and the frozen reference (None in LoRA mode)."""
    policy = load_causal_lm(cfg.model.model, cfg.model.trust_remote_code, tokenizer)
    disable_dropout(policy)
    ref_model = None
    if cfg.lora.lora_r > 0:
        policy = apply_lora(policy, cfg.lora)
    else:
        ref_model = copy.deepcopy(policy).eval().requires_grad_(False)
    value_model = None
    if cfg.ppo.value_model:
        vm = load_reward_model(cfg.ppo.value_model, cfg.model.trust_remote_code)
        disable_dropout(vm)
        value_model = SeparateValueModel(vm)
    return ActorCritic(policy, value_model), ref_model


def train(cfg: PPOConfig, scorer=None) -> dict:
    """Run PPO as configured. ``scorer`` replaces the reward model (any object with RewardScorer's
    ``score(prompts, responses, finished=...)``, ``stats`` and ``conservative_k``), e.g. a known function
    in tests."""
    # 1. Validate the prompts before anything heavy.
    examples = load_examples(cfg.data.data, "prompt", "rlhfkit ppo")
    eval_examples = load_examples(cfg.data.eval_data, "prompt", "rlhfkit ppo") if cfg.data.eval_data else []
    if len(examples) < cfg.optim.batch_size:
        raise UserError(f"{cfg.data.data}: {len(examples)} prompts, fewer than --batch-size {cfg.optim.batch_size}")
    gold = GoldEvaluator.create(cfg.ppo.gold_judge, eval_examples)

    # 2. The four roles.
    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    actor_critic, ref_model = build_models(cfg, tokenizer)
    prompt_ids = [encode_prompt(tokenizer, ex.prompt, cfg.data.max_prompt_length) for ex in examples]

    # 3. Session, trainer, resume.
    steps = (
        cfg.optim.max_steps
        if cfg.optim.max_steps > 0
        else updates.total_steps(cfg.optim, len(examples), cfg.optim.batch_size)
    )
    session = open_session(cfg, cfg.run, steps, desc="ppo")
    if scorer is None:
        scorer = RewardScorer.load(
            cfg.ppo.reward_model, session.device, cfg.model.trust_remote_code, pack=cfg.packing.pack_sequences
        )
    if ref_model is not None:
        ref_model.to(session.device)
    trainer = PPOTrainer(cfg, actor_critic, ref_model, scorer, tokenizer, session)
    stream = IndexStream(len(examples), cfg.run.seed)
    if cfg.run.resume:
        resumed = session.restore(trainer.checkpoint_models())
        trainer.load_state_dict(resumed, stream)
    samples = SampleWriter(session.output_dir, session.logger, resume_step=session.start_step)
    monitor = HackingMonitor(session.logger)
    if cfg.run.resume:
        monitor.load_state_dict(resumed["monitor"])

    # 4. The loop: one PPO step per batch of prompts.
    metrics: dict = {}
    for step in range(session.start_step + 1, steps + 1):
        index = stream.take(cfg.optim.batch_size)
        metrics = trainer.ppo_step([examples[i].prompt for i in index], [prompt_ids[i] for i in index])
        rollout = metrics.pop("_rollout", None)
        if gold is not None and (step % cfg.ppo.gold_steps == 0 or step == steps or step == 1):
            metrics["reward/gold"] = gold.evaluate(trainer.policy, tokenizer, cfg, session.device)
        if rollout is not None:
            texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
            metrics.update(monitor.observe(step, texts, metrics["reward/score"], metrics.get("reward/gold")))
        if session.log_due(step, cfg.run, metrics):
            session.logger.log(step, metrics)
        if rollout is not None and (step % cfg.ppo.sample_steps == 0 or step == steps):
            samples.write(step, [examples[i].prompt for i in index], rollout, tokenizer)
        if cfg.ppo.ref_update_steps and step % cfg.ppo.ref_update_steps == 0:
            trainer.refresh_reference()
        if session.save_due(step, cfg.run):
            session.save(
                step, trainer.checkpoint_models(), {**trainer.state_dict(stream), "monitor": monitor.state_dict()}
            )
        session.logger.advance()

    # 5. Final policy in Hugging Face format; the value head stays in checkpoints/.
    session.finish(trainer.policy, tokenizer)
    return metrics
