"""The `rlhfkit ppo` / `grpo` / `rloo` command around ``OnlineTrainer``: validate the prompts and rewards,
build the roles, open the session, run one step per batch of prompts, save the final policy."""

from __future__ import annotations

import copy

import torch

from rlhfkit.config.online import OnlineConfig
from rlhfkit.data.encode import encode_prompt
from rlhfkit.data.lengths import check_generation_fits, encode_prompts
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError, option
from rlhfkit.models.loading import (
    config_folder,
    load_causal_lm,
    load_reward_model,
    load_tokenizer,
    position_limit,
)
from rlhfkit.models.lora import adapter_on, apply_lora, continue_lora
from rlhfkit.models.reward import RewardScorer
from rlhfkit.models.sampling import stop_token_ids
from rlhfkit.models.vllm_engine import VLLMEngine, require_vllm
from rlhfkit.multiturn.rollout import MultiTurn
from rlhfkit.trainers.online.engine_check import EngineCheck
from rlhfkit.trainers.online.evaluation import HeldOutEvaluator
from rlhfkit.trainers.online.monitor import HackingMonitor
from rlhfkit.trainers.online.policy import ActorCritic, SeparateValueModel
from rlhfkit.trainers.online.reporting import GoldEvaluator, SampleWriter
from rlhfkit.trainers.online.rewards import TrainerState, build_rewards
from rlhfkit.trainers.online.trainer import OnlineTrainer, PromptBatch
from rlhfkit.training import engines, updates
from rlhfkit.training.distributed import gather_objects, per_rank
from rlhfkit.training.runtime import disable_dropout, seed_everything
from rlhfkit.training.session import open_session
from rlhfkit.training.stream import IndexStream


def check_split(cfg: OnlineConfig, world: int) -> None:
    """A step's completions split into whole groups per process, and each process's share into whole
    minibatches and micro-batches."""
    G = cfg.advantage.num_generations
    prompts = cfg.optim.batch_size // G
    if prompts % world:
        raise UserError(
            f"{option('batch_size', cfg.optim.batch_size)} / {option('num_generations', G)} = {prompts} prompts "
            "per step must be "
            f"divisible by the number of processes ({world}): a prompt's completions stay on one process"
        )
    split = cfg.policy.num_minibatches * cfg.optim.gradient_accumulation_steps
    per_rank(
        cfg.optim.batch_size,
        world,
        what=option("batch_size"),
        unit=split,
        unit_what=f"{option('num_minibatches')} x {option('gradient_accumulation_steps')}",
    )


def continues_adapter(cfg: OnlineConfig) -> bool:
    """Whether the policy is a LoRA adapter trained on --ref-model (a round of `rlhfkit iterate` continuing the
    last): with --lora-r it goes on training that adapter rather than new ones on its merged weights."""
    return (
        cfg.lora.lora_r > 0
        and cfg.needs_reference
        and bool(cfg.kl.ref_model)
        and adapter_on(cfg.model.model, cfg.kl.ref_model)
    )


def build_models(cfg: OnlineConfig, tokenizer) -> tuple[ActorCritic, torch.nn.Module | None]:
    """Policy (+LoRA), the value function when the estimator needs one, and the frozen reference: --ref-model, or
    a copy of the starting policy, or None (LoRA: the backbone with adapters off; or no KL term needs a
    reference)."""
    trust = cfg.model.trust_remote_code
    ref_model = None
    if continues_adapter(cfg):
        # a LoRA adapter trained on the reference trains on; the reference is its backbone with adapters off
        policy = continue_lora(load_causal_lm(cfg.kl.ref_model, trust, tokenizer), cfg.model.model)
        disable_dropout(policy)
    else:
        policy = load_causal_lm(cfg.model.model, trust, tokenizer)
        disable_dropout(policy)
        if cfg.needs_reference and cfg.kl.ref_model:
            ref_model = load_causal_lm(cfg.kl.ref_model, trust, tokenizer)
            disable_dropout(ref_model)
            ref_model = ref_model.eval().requires_grad_(False)
        if cfg.lora.lora_r > 0:
            policy = apply_lora(policy, cfg.lora)
        elif cfg.needs_reference and ref_model is None:
            ref_model = copy.deepcopy(policy).eval().requires_grad_(False)
    critic = getattr(cfg, "critic", None) if cfg.needs_critic else None
    value_model = None
    if critic is not None and critic.value_model:
        vm = load_reward_model(critic.value_model, cfg.model.trust_remote_code)
        disable_dropout(vm)
        value_model = SeparateValueModel(vm)
        if cfg.lora.lora_r > 0:  # adapters on its backbone as on the policy's; its score head trains in full
            value_model.backbone = apply_lora(value_model.backbone, cfg.lora, task_type="FEATURE_EXTRACTION")
    return ActorCritic(policy, value_model, critic=cfg.needs_critic), ref_model


def start_engine(cfg: OnlineConfig, policy, tokenizer, session) -> VLLMEngine:
    """The vLLM engine of --use-vllm, one per process, on the policy's model folder and in the precision the
    policy runs in; its seed differs per process like the own sampler's draws do."""
    mixed = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(session.accelerator.mixed_precision))
    dtype = mixed or next(policy.parameters()).dtype
    # single-turn: the longest prompt plus a reply; conversations: the model's own limit
    max_len = None if cfg.multi_turn else cfg.data.max_prompt_length + cfg.generation.max_new_tokens
    return VLLMEngine.start(
        str(config_folder(cfg.model.model)),  # the architecture; the weights come from the policy before a sample
        stop_token_ids(policy, tokenizer),
        cfg.vllm,
        dtype=dtype,
        device=session.device,
        seed=cfg.run.seed + session.ranks.rank,
        max_model_len=max_len,
        in_process=session.ranks.world == 1,
    )


def check_prompts(cfg: OnlineConfig, tokenizer, examples: list, eval_examples: list) -> list[list[int]]:
    """The prompts' ids, their lengths said (``rlhfkit.data.lengths``) and checked against the model's
    positions before it loads. A conversation's opening is not cut: --max-total-tokens bounds it."""
    max_prompt, generation = cfg.data.max_prompt_length, cfg.generation
    model, limit = cfg.model.model, position_limit(cfg.model.model)
    if cfg.multi_turn:
        check_generation_fits(model, limit, [], generation.max_new_tokens, cfg.multiturn.max_total_tokens)
        return [encode_prompt(tokenizer, ex.prompt, max_prompt) for ex in examples]
    truncate = generation.truncate_prompts
    ids = encode_prompts(tokenizer, [ex.prompt for ex in examples], max_prompt, truncate, cfg.data.data)
    held_out = encode_prompts(tokenizer, [ex.prompt for ex in eval_examples], max_prompt, truncate, cfg.data.eval_data)
    check_generation_fits(model, limit, ids + held_out, generation.max_new_tokens)
    return ids


def train(cfg: OnlineConfig, scorer=None) -> dict:
    """Run the online-RL algorithm ``cfg`` configures (``PPOConfig``, ``GRPOConfig``, ``RLOOConfig``).
    ``scorer`` replaces the reward model (any object with RewardScorer's ``score(prompts, responses,
    finished=...)``, ``stats`` and ``conservative_k``), e.g. a known function in tests."""
    name = f"rlhfkit {cfg.algorithm}"
    # 1. Validate the prompts and the rewards before anything heavy.
    examples = load_examples(cfg.data.data, "prompt", name)
    eval_examples = load_examples(cfg.data.eval_data, "prompt", name) if cfg.data.eval_data else []
    G = cfg.advantage.num_generations
    prompts_per_step = cfg.optim.batch_size // G
    if len(examples) < prompts_per_step:
        raise UserError(
            f"{cfg.data.data}: {len(examples)} prompts, fewer than the {prompts_per_step} a step takes "
            f"({option('batch_size', cfg.optim.batch_size)} / {option('num_generations', G)})"
        )
    gold = GoldEvaluator.create(cfg.monitor.gold_judge, eval_examples)
    if cfg.vllm.use_vllm:
        require_vllm()
    env = bool(cfg.multiturn.env)
    columns = list(dict.fromkeys(k for ex in examples for k in ex.extra))
    rewards = build_rewards(cfg.reward, cfg.data.data, env=env, columns=columns)  # functions checked now

    # 2. The roles (tools and environment first: they are checked before the models load).
    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    multiturn = MultiTurn(cfg.multiturn, tokenizer, cfg.data.data) if cfg.multi_turn else None
    prompt_ids = check_prompts(cfg, tokenizer, examples, eval_examples)
    seed_everything(cfg.run.seed)  # new weights (LoRA) start the same on every process
    actor_critic, ref_model = build_models(cfg, tokenizer)

    # 3. Session, trainer, resume.
    steps = (
        cfg.optim.max_steps
        if cfg.optim.max_steps > 0
        else updates.total_steps(cfg.optim, len(examples), prompts_per_step)
    )
    session = open_session(cfg, cfg.run, steps, desc=cfg.algorithm)
    ranks = session.ranks
    check_split(cfg, ranks.world)
    updates.check_engine(session.accelerator, cfg.optim)
    if scorer is None and cfg.reward.reward_model:
        scorer = RewardScorer.load(cfg.reward.reward_model, session.device, cfg.model.trust_remote_code)
    rewards = build_rewards(cfg.reward, cfg.data.data, scorer, env, columns) if scorer is not None else rewards
    if ref_model is not None:
        ref_model.to(session.device)
    engine = start_engine(cfg, actor_critic.policy, tokenizer, session) if cfg.vllm.use_vllm else None
    trainer = OnlineTrainer(cfg, actor_critic, ref_model, rewards, tokenizer, session, multiturn, engine)
    stream = IndexStream(len(examples), cfg.run.seed)
    resumed = session.restore(trainer.checkpoint_models(), trainer.optimizer) if cfg.run.resume else None
    if resumed is not None:
        trainer.load_state_dict(resumed, stream)
    elif cfg.optim.optimizer_state:
        updates.carry_in(session.accelerator, trainer.optimizer, trainer.scheduler, cfg.optim.optimizer_state)
    samples = SampleWriter(session.output_dir, session.logger, resume_step=session.start_step)
    monitor = HackingMonitor(session.logger)
    engine_check = EngineCheck(session.logger, G) if engine is not None else None
    held_out = None
    if eval_examples and cfg.run.evaluates():
        eval_ids = [encode_prompt(tokenizer, ex.prompt, cfg.data.max_prompt_length) for ex in eval_examples]
        judge = gold.judge if gold is not None else None
        held_out = HeldOutEvaluator(eval_examples, eval_ids, session.output_dir, judge, session.start_step)
    if resumed is not None:
        monitor.load_state_dict(resumed["monitor"])

    # 4. The loop: one step per batch of prompts.
    metrics: dict = {}
    for step in range(session.start_step + 1, steps + 1):
        # Every process takes the same prompts from the stream and keeps its own block of them.
        index = ranks.block(stream.take(prompts_per_step))
        batch = PromptBatch(examples, prompt_ids, index, G, first_group=ranks.rank * len(index))
        rewards.state = TrainerState(global_step=step - 1, max_steps=steps)
        result = trainer.step(batch)
        metrics, rollout = result.metrics, result.rollout  # the rollout: the whole batch, every process's rows
        if gold is not None and (step % cfg.monitor.gold_steps == 0 or step == steps or step == 1):
            with engines.gathered_for_generation(session.accelerator, trainer.actor_critic):
                metrics["reward/gold"] = gold.evaluate(trainer.policy, tokenizer, cfg, session.device, multiturn)
        if held_out is not None and session.eval_due(step, cfg.run.eval_steps):
            metrics.update(held_out.evaluate(trainer, step))
        if rollout is not None:
            texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
            metrics.update(monitor.observe(step, texts, metrics["reward/score"], metrics.get("reward/gold")))
        if engine_check is not None:
            engine_check.observe(step, rollout, metrics)
        if session.log_due(step, cfg.run, metrics):
            session.logger.log(step, metrics)
        if rollout is not None and (step % cfg.monitor.sample_steps == 0 or step == steps):
            messages = gather_objects(trainer.last_messages) if trainer.last_messages is not None else None
            samples.write(step, gather_objects(batch.prompts), rollout, tokenizer, ranks.world, messages)
        state = lambda: {**trainer.state_dict(stream), "monitor": monitor.state_dict()}  # noqa: E731
        if session.save_due(step, cfg.run):
            session.save(step, trainer.checkpoint_models(), state(), trainer.optimizer)
        session.logger.advance()
        session.stop_if_requested(step, trainer.checkpoint_models(), state(), trainer.optimizer)

    if engine is not None:
        engine.close()
    # 5. Final policy in Hugging Face format; a value head stays in checkpoints/.
    session.finish(trainer.actor_critic, tokenizer, prefix="policy.")
    return metrics
