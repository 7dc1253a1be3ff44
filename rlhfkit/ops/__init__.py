"""Pure-torch RLHF math: statistics, KL, advantages, losses, KL control. No model code, no I/O.

Shapes ``[B, T]`` are batch × response tokens; ``mask`` is 1 on real tokens and 0 on padding.
"""

from .advantages import gae, per_token_rewards, sequence_advantage
from .aggregation import aggregate_loss
from .critic_free import (
    discounted_returns,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline,
    rloo_advantages,
)
from .engine_mismatch import logprob_gap, truncated_importance_weights
from .ensemble import ENSEMBLE_OBJECTIVES, ensemble_reward
from .estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    AdvantageEstimator,
    get_advantage_estimator,
    register_advantage_estimator,
)
from .groups import Groups
from .kl import kl_penalty
from .kl_control import AdaptiveKLController, FixedKLController, KLController
from .logprobs import logprobs_from_logits
from .losses import (
    POLICY_LOSSES,
    PPOLossConfig,
    PPOLossTerms,
    bradley_terry_loss,
    dpo_loss,
    entropy_from_logits,
    get_policy_loss,
    ppo_loss,
    ppo_policy_loss,
    ppo_policy_loss_per_token,
    register_policy_loss,
    sequence_ratio_policy_loss,
    value_loss,
)
from .reference import ema_update
from .stats import explained_variance, masked_mean, masked_var, masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ENSEMBLE_OBJECTIVES",
    "POLICY_LOSSES",
    "PPOLossConfig",
    "PPOLossTerms",
    "AdaptiveKLController",
    "AdvantageConfig",
    "AdvantageEstimator",
    "FixedKLController",
    "Groups",
    "KLController",
    "aggregate_loss",
    "bradley_terry_loss",
    "discounted_returns",
    "dpo_loss",
    "ema_update",
    "ensemble_reward",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "get_advantage_estimator",
    "get_policy_loss",
    "grpo_advantages",
    "kl_penalty",
    "logprob_gap",
    "logprobs_from_logits",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "per_token_rewards",
    "ppo_loss",
    "ppo_policy_loss",
    "ppo_policy_loss_per_token",
    "register_advantage_estimator",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline",
    "rloo_advantages",
    "sequence_advantage",
    "sequence_ratio_policy_loss",
    "truncated_importance_weights",
    "value_loss",
]
