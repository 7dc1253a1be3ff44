"""Pure-torch RLHF math: statistics, KL, advantages, losses, KL control. No model code, no I/O.

Shapes ``[B, T]`` are batch × response tokens; ``mask`` is 1 on real tokens and 0 on padding.
"""

from .advantages import gae, per_token_rewards, sequence_advantage
from .kl import KL_ESTIMATORS, kl_penalty
from .kl_control import AdaptiveKLController, FixedKLController, KLController
from .logprobs import logprobs_from_logits
from .losses import (
    DPO_LOSS_TYPES,
    bradley_terry_loss,
    dpo_loss,
    entropy_from_logits,
    ppo_policy_loss,
    value_loss,
)
from .stats import explained_variance, masked_mean, masked_var, masked_whiten

__all__ = [
    "AdaptiveKLController",
    "DPO_LOSS_TYPES",
    "FixedKLController",
    "KLController",
    "KL_ESTIMATORS",
    "bradley_terry_loss",
    "dpo_loss",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "per_token_rewards",
    "ppo_policy_loss",
    "sequence_advantage",
    "value_loss",
]
