"""`rlhfkit ppo`, `rlhfkit grpo`, `rlhfkit rloo`: one online-RL loop, the algorithm a choice of options.

One step (``OnlineTrainer.step``) is the loop of the RLHF literature, each step one call:
  0. a reference that follows the policy takes the last step's update: a copy of the policy every
     --ref-update-steps steps, or its EMA with --ref-ema                          ``OnlineTrainer.move_reference``
  1. generate G completions per prompt with the current policy                      ``rollout.sample``
  2. reward them (reward model, Python functions, a task's judge; weighted)          ``rewards.Rewards``
  3. log-probs under the rollout ("old") policy and, when a KL term needs it, the frozen reference
  4. values from the value function (same forward pass as 3 for a value head; only with a critic)
                                                                                     ``OnlineTrainer.score_tokens``
  5. per-token rewards r_t = -beta*KL_t (when the KL is in the reward), plus the reward at the last real token
  6. advantages: the algorithm's estimator (``rlhfkit.ops.estimators``)  ``advantages.assign_rewards_and_advantages``
  7. epochs over minibatches of the loss ``rlhfkit.ops.ppo_loss``: clipped surrogate + c1*value loss
     - c2*entropy + KL in the loss, each token loss reduced by --loss-aggregation    ``update.PPOUpdate``
  8. update beta, log, write samples                                                 ``reporting.rollout_metrics``

PPO is GAE with a critic and the KL in the reward; GRPO is the group estimator with the KL in the loss and
one update per batch; RLOO the leave-one-out estimator with one importance ratio per completion. Their
defaults are the configs in ``rlhfkit.config.online``. The performance choreography (heap, the value model's
passes) is ``rlhfkit.accel.online.OnlineAccel``, called at fixed points of the step.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlhfkit import ops
from rlhfkit.accel.online import OnlineAccel
from rlhfkit.config.online import OnlineConfig
from rlhfkit.errors import UserError, option
from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.lora import adapters_off
from rlhfkit.multiturn.rollout import MultiTurn
from rlhfkit.trainers.online import advantages
from rlhfkit.trainers.online.policy import ActorCritic, ActorCriticOutput, Networks
from rlhfkit.trainers.online.reporting import reward_metrics, rollout_metrics, timed
from rlhfkit.trainers.online.rewards import RewardOutput, Rewards
from rlhfkit.trainers.online.rollout import (
    Completions,
    Experience,
    PromptBatch,
    Rollout,
    StepResult,
    gather_rollout,
    sample,
)
from rlhfkit.trainers.online.update import PPOUpdate
from rlhfkit.training import engines, updates
from rlhfkit.training.distributed import gather_rows, reduce_mean
from rlhfkit.training.stream import IndexStream

__all__ = ["OnlineTrainer", "PromptBatch"]

MAX_BAD_UPDATES = 3  # consecutive non-finite steps before the run stops


class OnlineTrainer:
    """Holds the roles (policy, optional critic, optional reference, rewards) and runs ``step``. Built by
    ``rlhfkit.trainers.online.run.train``; usable from Python too.

    ``ref_model``: the frozen reference, or None: then with LoRA the reference is the policy's backbone
    with its adapters off, and without LoRA there is none (no KL term needs one: ``cfg.needs_reference``).
    ``multiturn``: the tools and environment of multi-turn rollouts (``rlhfkit.multiturn``); None: one reply
    per prompt. ``engine``: a ``rlhfkit.models.vllm_engine.VLLMEngine`` that samples the rollouts (--use-vllm);
    None: rlhfkit's own sampler.
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
        engine=None,
    ):
        self.cfg, self.gen, self.kl_args = cfg, cfg.generation, cfg.kl
        self.multiturn, self.engine = multiturn, engine
        self.last_messages: list | None = None  # the conversations of the last multi-turn rollout (samples)
        self.actor_critic, self.ref_model, self.rewards = actor_critic, ref_model, rewards
        self.tokenizer, self.session = tokenizer, session
        self.accelerator, self.device = session.accelerator, session.device
        self.has_reference = cfg.needs_reference and (ref_model is not None or cfg.lora.lora_r > 0)
        k = self.kl_args
        self.kl_ctl = (
            ops.AdaptiveKLController(k.kl_coef, k.target_kl, k.kl_horizon)
            if k.target_kl is not None
            else ops.FixedKLController(k.kl_coef)
        )
        value_model = actor_critic.value_model
        if cfg.optim.gradient_checkpointing:
            updates.enable_gradient_checkpointing(actor_critic.policy, value_model.backbone if value_model else None)
        updates_per_step = cfg.policy.ppo_epochs * cfg.policy.num_minibatches
        optim_args = replace(cfg.optim, warmup_steps=cfg.optim.warmup_steps * updates_per_step)
        self.optimizer = updates.build_optimizer(actor_critic, optim_args)
        steps = updates.schedule_length(cfg.optim, session.total_steps)
        self.scheduler = updates.build_scheduler(self.optimizer, optim_args, steps * updates_per_step)
        self.actor_critic, self.optimizer = self.accelerator.prepare(actor_critic, self.optimizer)
        critic = getattr(cfg, "critic", None) if actor_critic.has_critic else None
        self.accel = OnlineAccel(
            self.device,
            value_model=value_model,
            value_pass_apart=critic is not None and critic.value_pass_apart,
            single_process=engines.engine(self.accelerator) == "single",
        )
        self.shuffle = torch.Generator().manual_seed(cfg.run.seed)  # minibatch order
        self.bad_steps = 0
        self.steps_done = session.start_step  # steps run so far, a resumed run's included
        self.reference_behind = False  # the reference has yet to take the last step's update (step 0)
        # the most policy tokens of a row (the length a Dr. GRPO token sum is normalised by)
        max_tokens = self.gen.max_new_tokens * (cfg.multiturn.max_turns if multiturn is not None else 1)
        self.update = PPOUpdate(
            cfg,
            self.accelerator,
            self.actor_critic,
            self.optimizer,
            self.scheduler,
            self.accel.value_rows if self.accel.value_apart else None,
            lambda rows, networks: self.forward(rows, networks, with_entropy=True),
            self.shuffle,
            max_tokens,
        )

    @property
    def policy(self):
        return self.accelerator.unwrap_model(self.actor_critic).policy

    @property
    def kl_in_reward(self) -> bool:
        return self.has_reference and not self.kl_args.kl_in_loss

    @property
    def kl_in_loss_coef(self) -> float | None:
        """The weight of the loss's KL term: beta with --kl-in-loss, plus --kl-loss-coef; None for no KL term."""
        k = self.kl_args
        if not self.has_reference or not (k.kl_in_loss or k.kl_loss_coef > 0):
            return None
        return (self.kl_ctl.value if k.kl_in_loss else 0.0) + k.kl_loss_coef

    @property
    def reuses_first_pass(self) -> bool:
        """One minibatch, no accumulation, no dropout: the first epoch's forward pass (with grad) is exactly
        the rollout policy's forward, so it also yields the old log-probs and values (steps 3-4) and is not
        run twice. Ratios are then exactly 1 in epoch 1, as the PPO math has them."""
        p = self.cfg.policy
        return (
            p.num_minibatches == 1
            and self.cfg.optim.gradient_accumulation_steps == 1
            and p.ppo_epochs > 0
            and self.cfg.lora.lora_dropout == 0
        )

    # ---- the teacher-forced passes ---------------------------------------------------------------
    def forward(self, rows: Rollout | Completions, networks: Networks, with_entropy: bool) -> ActorCriticOutput:
        """The actor-critic's pass over ``rows``, with gradients where enabled."""
        T, temperature = rows.response_ids.shape[1], self.gen.temperature
        return self.actor_critic(rows.input_ids, rows.attention_mask, T, temperature, with_entropy, networks=networks)

    def reference_logprobs(self, input_ids, attention_mask, n_response: int) -> torch.Tensor:
        """``[B, T]`` log-probs under the frozen reference (LoRA: the policy with its adapters off)."""
        temperature = self.gen.temperature
        if self.ref_model is None:
            # the policy is called outside the wrapped actor-critic's forward: under FSDP2 its parameters are
            # gathered for the pass, as for sampling
            with engines.gathered_for_generation(self.accelerator, self.actor_critic), adapters_off(self.policy):
                return response_logprobs(self.policy, input_ids, attention_mask, n_response, temperature)
        return response_logprobs(self.ref_model, input_ids, attention_mask, n_response, temperature)

    def score_tokens(self, c: Completions) -> tuple[ActorCriticOutput, torch.Tensor | None, ActorCriticOutput | None]:
        """Steps 3-4: the old log-probs and values ``[B, T]`` (masked to the policy's tokens), the reference's
        log-probs, and epoch 1's forward outputs when the rollout's pass stands in for it
        (``reuses_first_pass``: then it runs with gradients; else None)."""
        ids, attn, T = c.input_ids, c.attention_mask, c.response_ids.shape[1]
        first_pass = None
        with self.accelerator.autocast():
            if self.reuses_first_pass:
                self.actor_critic.train()
                networks = Networks.POLICY if self.accel.value_apart else Networks.ALL
                with torch.enable_grad():
                    first_pass = self.actor_critic(ids, attn, T, self.gen.temperature, True, networks=networks)
                logprobs, values = first_pass.logprobs.detach(), _detach(first_pass.values)
                if self.accel.value_apart:
                    values = self.actor_critic(ids, attn, T, networks=Networks.VALUE).values
            else:
                logprobs, values, _ = self.actor_critic(ids, attn, T, self.gen.temperature)
            ref_logprobs = self.reference_logprobs(ids, attn, T) if self.has_reference else None
        mask = c.action_mask.float()
        old = ActorCriticOutput(logprobs * mask, values * mask if values is not None else None, None)
        return old, ref_logprobs * mask if ref_logprobs is not None else None, first_pass

    # ---- steps 1-6: experience -------------------------------------------------------------------
    def assign_rewards_and_advantages(self, r: Rollout, metrics: dict) -> Rollout:
        """Steps 5-6 on a whole batch (``advantages.assign_rewards_and_advantages``)."""
        return advantages.assign_rewards_and_advantages(r, self.cfg, self.kl_ctl.value, self.kl_in_reward, metrics)

    @torch.no_grad()
    def make_rollout(self, batch: PromptBatch) -> Experience:
        """Steps 1-6 for a batch of prompts, each already repeated G times (``batch.group_ids`` names each row's
        prompt group)."""
        metrics: dict[str, float] = {}
        with timed(metrics, "time/rollout_s"):
            # 1. Generate (multi-turn: play the conversations, tools and environment answering between replies).
            with timed(metrics, "time/generate_s"):
                self.actor_critic.eval()
                with engines.gathered_for_generation(self.accelerator, self.actor_critic):
                    sampled = sample(
                        self.policy,
                        self.tokenizer,
                        batch,
                        self.gen,
                        self.device,
                        self.multiturn,
                        self.rewards.env_weight,
                        self.engine,
                    )
                self.last_messages = sampled.messages
                metrics.update(sampled.metrics)
                self.accel.after_sampling()
            # 2. Reward.
            with timed(metrics, "time/score_s"):
                reward = self.rewards(sampled.reward_batch)
                components = {k: gather_rows(self.accelerator, v.to(self.device)) for k, v in reward.components.items()}
            # 3-4. Old log-probs and values (one pass), reference log-probs.
            with timed(metrics, "time/forward_s"):
                c = sampled.completions
                old, ref_logprobs, first_pass = self.score_tokens(c)
                local = self.new_rollout(c, reward, batch, old, ref_logprobs)
                if local.engine_logprobs is not None:  # the sampling engine's view of the same tokens
                    gap = ops.logprob_gap(old.logprobs, local.engine_logprobs, c.action_mask)
                    metrics["rollout/logprob_diff"] = float(gap)
            # 5-6. Per-token rewards and advantages need the whole batch (group and batch statistics, whitening):
            # with several processes every rank gathers every rank's rows and computes them exactly as one process
            # would, then keeps its own.
            everyone = self.assign_rewards_and_advantages(
                gather_rollout(self.accelerator, local, self.tokenizer.pad_token_id), metrics
            )
            metrics.update(reward_metrics(components, everyone.valid, self.cfg.algorithm))
            rows = torch.arange(len(batch.rows), device=self.device) + self.session.ranks.rank * len(batch.rows)
            mine, T = everyone.select(rows), local.n_response  # the gathered batch may be wider than this process's
            rollout = replace(
                local,
                loss_mask=mine.loss_mask[:, :T],
                scores=mine.scores,
                rewards=mine.rewards[:, :T],
                advantages=mine.advantages[:, :T],
                returns=mine.returns[:, :T],
            )
        return Experience(rollout, everyone, first_pass, metrics)

    def new_rollout(self, c: Completions, reward: RewardOutput, batch: PromptBatch, old, ref_logprobs) -> Rollout:
        """This process's rollout from steps 1-4; its rewards, advantages and returns are set by steps 5-6."""
        zeros = lambda: torch.zeros_like(c.action_mask, dtype=torch.float)  # noqa: E731
        return Rollout(
            query_ids=c.query_ids,
            query_mask=c.query_mask,
            response_ids=c.response_ids,
            response_mask=c.response_mask,
            action_mask=c.action_mask,
            loss_mask=c.action_mask,
            group_ids=torch.tensor(batch.group_ids, device=self.device),
            scores=reward.total.to(self.device).float(),
            raw_scores=reward.score.to(self.device),
            valid=reward.valid.to(self.device),
            finished=torch.tensor(c.finished, device=self.device),
            logprobs=old.logprobs,
            ref_logprobs=ref_logprobs,
            values=old.values,
            turn_rewards=c.turn_rewards,
            rewards=zeros(),
            advantages=zeros(),
            returns=zeros(),
            engine_logprobs=c.engine_logprobs * c.action_mask if c.engine_logprobs is not None else None,
        )

    # ---- the step ----------------------------------------------------------------------------------
    def step(self, batch: PromptBatch) -> StepResult:
        """Steps 0-8 on one batch of prompts (repeated G times); returns the step's metrics and the whole batch's
        rollout, or an empty result when a non-finite reward or loss made the step skip its update."""
        # 0. The reference takes the last step's update. It moves here rather than right after that update, so
        # that what runs between two steps (the held-out evaluation's KL, a checkpoint) sees the reference the
        # last step trained against.
        self.move_reference()
        self.steps_done += 1
        self.reference_behind = self.follows_policy
        metrics: dict[str, float] = {}  # the step's log (left empty when the step skips its update)
        with timed(metrics, "time/step_s"):
            # the rate of this step's first update (as the other trainers log it: this step's, not the next one's)
            learning_rate = self.scheduler.get_last_lr()[0]
            # 1-6. Generate, reward, log-probs and values, per-token rewards and advantages.
            experience = self.make_rollout(batch)
            if not experience.finite:
                return self._skip("reward")
            self.accel.after_rollout()
            # 7. Epochs over minibatches.
            with timed(experience.metrics, "time/update_s"):
                warmup = self.critic_warmup
                train_stats = self.update.train_epochs(
                    experience.rollout, self.kl_in_loss_coef, experience.first_pass, value_only=warmup
                )
                experience.first_pass = None  # spent by epoch 1
                if train_stats is None:
                    return self._skip("loss")
                self.bad_steps = 0
                if self.engine is not None:
                    self.engine.updated()  # the engine loads the new weights before it samples again
            # 8. Control and log: the experience metrics and beta's update come from the whole batch (the same on
            # every process); the loss terms and timings are averaged over processes.
            metrics.update(rollout_metrics(experience.everyone, self.kl_ctl.value))
            metrics.update(reduce_mean(self.accelerator, {**experience.metrics, **train_stats}))
            if self.has_reference:
                self.kl_ctl.update(metrics["kl/ref"], n_steps=experience.everyone.scores.shape[0])
            metrics["learning_rate"] = learning_rate
            if warmup:
                metrics["value/warmup"] = 1.0
        return StepResult(metrics, experience.everyone)

    @property
    def critic_warmup(self) -> bool:
        """Whether this step trains the value model alone (--value-warmup-steps)."""
        critic = getattr(self.cfg, "critic", None)
        return critic is not None and self.steps_done <= critic.value_warmup_steps

    def _skip(self, what: str) -> StepResult:
        self.bad_steps += 1
        self.session.logger.write(f"warning: non-finite {what}; this update was skipped")
        if self.bad_steps >= MAX_BAD_UPDATES:
            raise UserError(
                f"{self.cfg.algorithm}: {MAX_BAD_UPDATES} non-finite updates in a row; stopping "
                f"(try a lower {option('learning_rate')}, {option('reward_clip')}, or check the rewards)"
            )
        return StepResult()

    # ---- step 0: a reference that follows the policy -------------------------------------------------
    @property
    def follows_policy(self) -> bool:
        """Whether the reference moves with the policy (--ref-update-steps, --ref-ema): the KL penalty then
        measures the drift from a recent policy rather than from the start."""
        return bool(self.kl_args.ref_update_steps or self.kl_args.ref_ema)

    def move_reference(self) -> None:
        """Step 0: the reference takes the update of step ``steps_done`` when it has not yet: the policy copied
        into it when that step is a multiple of --ref-update-steps, then with --ref-ema the moving average
        ref <- (1 - alpha) ref + alpha policy (``ops.ema_update``)."""
        if not self.reference_behind:
            return
        k = self.kl_args
        if k.ref_update_steps and self.steps_done % k.ref_update_steps == 0:
            self.refresh_reference()
        if k.ref_ema:
            ops.ema_update(self.ref_model, self.policy, k.ref_ema)
        self.reference_behind = False

    def refresh_reference(self) -> None:
        """Copy the current policy into the frozen reference."""
        self.ref_model.load_state_dict(self.policy.state_dict())

    # ---- checkpoints -------------------------------------------------------------------------------
    def checkpoint_models(self) -> dict:
        models = {"actor_critic": self.actor_critic}
        if (self.kl_args.ref_update_steps or self.kl_args.ref_ema) and self.ref_model is not None:
            models["reference"] = self.ref_model
        return models

    def state_dict(self, stream: IndexStream) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "kl_controller": self.kl_ctl.state_dict(),
            "stream": stream.state_dict(),
            "shuffle": self.shuffle.get_state(),
            "reference_behind": self.reference_behind,
        }

    def load_state_dict(self, state: dict, stream: IndexStream) -> None:
        if "optimizer" in state:  # a sharding engine restored it with the model
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.kl_ctl.load_state_dict(state["kl_controller"])
        stream.load_state_dict(state["stream"])
        self.shuffle.set_state(state["shuffle"])
        # a checkpoint without the flag holds a reference that has taken its step's update
        self.reference_behind = state.get("reference_behind", False)


def _detach(x: torch.Tensor | None) -> torch.Tensor | None:
    return x.detach() if x is not None else None
