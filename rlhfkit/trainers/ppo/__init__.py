"""PPO for RLHF: policy, rollout, scoring, the trainer and its reporting."""

from rlhfkit.trainers.ppo.trainer import PPOTrainer, train

__all__ = ["PPOTrainer", "train"]
