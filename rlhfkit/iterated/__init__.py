"""Iterated RLHF (`rlhfkit iterate`): the preference loop closed. Each round the current policy's replies are
judged (``judges.py``: a Python function; ``human.py``: people on the labelling page), the reward model
continues on all pairs so far, and PPO continues from the last round (``loop.py``; ``models.py``: what a round
hands to the next)."""

from rlhfkit.iterated.loop import run

__all__ = ["run"]
