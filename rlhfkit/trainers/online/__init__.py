"""Online RL: PPO, GRPO, RLOO and REINFORCE++ on one loop (``trainer.py``: the step), run by one command
(``run.py``: validate, build the roles, loop, save), with the rewards as one protocol (``rewards.py``), the
policy and optional critic (``policy.py``), the rollout (``rollout.py``), its reporting, the held-out
evaluation (``evaluation.py``) and the reward-hacking monitor."""

from rlhfkit.trainers.online.run import train
from rlhfkit.trainers.online.trainer import OnlineTrainer

__all__ = ["OnlineTrainer", "train"]
