"""rlhfkit: RLHF on one machine — SFT, Bradley–Terry reward models, PPO with a KL penalty, and DPO."""

from rlhfkit.errors import UserError

__version__ = "0.1.0"
__all__ = ["UserError", "__version__"]
