"""Benchmarks of what the methods learn: the demo over seeds and the choices behind its settings (DPO's beta, the
reward model with LoRA, PPO's value function), GRPO's loss aggregation, iterated RLHF on the built-in tasks, vLLM's
rollouts against the own sampler, and a small model as the judge."""
