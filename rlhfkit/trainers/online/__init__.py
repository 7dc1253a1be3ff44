"""Online RL: PPO, GRPO, RLOO and REINFORCE++ on one loop (``trainer.py``), with the rewards as one
protocol (``rewards.py``), the policy and optional critic (``policy.py``), the rollout (``rollout.py``), its
reporting and the reward-hacking monitor."""

from rlhfkit.trainers.online.trainer import OnlineTrainer, train

__all__ = ["OnlineTrainer", "train"]
