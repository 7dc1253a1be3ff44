import math
import statistics

import pytest
import torch

from rlhfkit import ops
from rlhfkit.ops import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    gae,
    get_advantage_estimator,
    per_token_rewards,
    register_advantage_estimator,
    reinforce_pp_advantages,
    sequence_advantage,
)

TOL = dict(rtol=0, atol=1e-6)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# Two prompts × G = 2 completions with scores [1, 3 | 2, 2] at the last real token; row 2 pads one token.
SCORES = t([1.0, 3.0, 2.0, 2.0])
MASK = t([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
TOKEN_REWARDS = per_token_rewards(SCORES, torch.zeros(4, 3, dtype=torch.float64), MASK, kl_coef=0.0)
VALUES = t([[0.5, 0.1, 0.2], [0.3, 0.3, 0.3], [1.0, -1.0, 9.0], [0.0, 0.0, 0.0]])


def broadcast(per_row):
    return t(per_row).unsqueeze(-1) * MASK


def test_required_estimators_are_registered():
    assert {"gae", "sequence", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"} <= ADVANTAGE_ESTIMATORS.keys()
    assert {name for name, est in ADVANTAGE_ESTIMATORS.items() if est.needs_critic} == {"gae", "sequence"}
    groups = {name for name, est in ADVANTAGE_ESTIMATORS.items() if est.compares_group}
    assert groups == {"grpo", "rloo", "reinforce_pp_baseline"}


def test_critic_estimators_need_values_and_delegate():
    config = AdvantageConfig(gamma=0.9, lam=0.8)
    with pytest.raises(ValueError, match="value head"):
        get_advantage_estimator("gae")(TOKEN_REWARDS, MASK, config)
    adv, ret = get_advantage_estimator("gae")(TOKEN_REWARDS, MASK, config, values=VALUES)
    expected_adv, expected_ret = gae(TOKEN_REWARDS, VALUES, MASK, 0.9, 0.8)
    torch.testing.assert_close(adv, expected_adv, **TOL)
    torch.testing.assert_close(ret, expected_ret, **TOL)
    adv, ret = ADVANTAGE_ESTIMATORS["sequence"](TOKEN_REWARDS, MASK, config, VALUES)
    expected_adv, expected_ret = sequence_advantage(TOKEN_REWARDS, VALUES, MASK)
    torch.testing.assert_close(adv, expected_adv, **TOL)
    torch.testing.assert_close(ret, expected_ret, **TOL)


def test_grpo_estimator_by_hand():
    # group 0: mean 2, unbiased std √2 -> ∓1/(√2 + 1e-4); group 1: equal scores -> 0
    adv, ret = ADVANTAGE_ESTIMATORS["grpo"](TOKEN_REWARDS, MASK, AdvantageConfig(group_size=2))
    a = 1 / (math.sqrt(2) + 1e-4)
    torch.testing.assert_close(adv, broadcast([-a, a, 0.0, 0.0]), **TOL)
    torch.testing.assert_close(ret, broadcast([1.0, 3.0, 2.0, 2.0]), **TOL)
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](TOKEN_REWARDS, MASK, AdvantageConfig(group_size=2, scale="none"))
    torch.testing.assert_close(adv, broadcast([-1.0, 1.0, 0.0, 0.0]), **TOL)


def test_group_estimators_use_the_kl_penalised_sequence_reward():
    kl = t([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 0.0, 7.0], [0.0, 0.0, 0.0]])  # 7.0 sits on padding
    rewards = per_token_rewards(SCORES, kl, MASK, kl_coef=0.5)
    # sequence rewards s − β·Σ KL = [1 − 1, 3, 2 − 1, 2]; RLOO with G = 2: s_i − s_j
    adv, ret = ADVANTAGE_ESTIMATORS["rloo"](rewards, MASK, AdvantageConfig(group_size=2))
    torch.testing.assert_close(adv, broadcast([-3.0, 3.0, -1.0, 1.0]), **TOL)
    torch.testing.assert_close(ret, broadcast([0.0, 3.0, 1.0, 2.0]), **TOL)


def test_reinforce_pp_estimator_delegates():
    adv, ret = ADVANTAGE_ESTIMATORS["reinforce_pp"](TOKEN_REWARDS, MASK, AdvantageConfig(gamma=0.5))
    expected_adv, expected_ret = reinforce_pp_advantages(TOKEN_REWARDS, MASK, gamma=0.5)
    torch.testing.assert_close(adv, expected_adv, **TOL)
    torch.testing.assert_close(ret, expected_ret, **TOL)
    # returns by hand: the score discounted back from the last real token
    torch.testing.assert_close(ret[2], t([2.0 * 0.5, 2.0, 0.0]), **TOL)


def test_reinforce_pp_baseline_estimator_by_hand():
    adv, _ = ADVANTAGE_ESTIMATORS["reinforce_pp_baseline"](TOKEN_REWARDS, MASK, AdvantageConfig(group_size=2))
    # centred scores [−1, 1, 0, 0] on 3, 3, 2, 3 real tokens, then whitened over those 11 tokens
    real = [-1.0] * 3 + [1.0] * 3 + [0.0] * 2 + [0.0] * 3
    mean, var = statistics.mean(real), statistics.variance(real)
    w = [(x - mean) / math.sqrt(var + 1e-8) for x in (-1.0, 1.0, 0.0)]
    expected = t([[w[0]] * 3, [w[1]] * 3, [w[2], w[2], 0.0], [w[2]] * 3])
    torch.testing.assert_close(adv, expected, **TOL)


def test_registry_lookup_and_registration():
    with pytest.raises(ValueError, match="unknown advantage estimator 'vtrace'.*grpo"):
        get_advantage_estimator("vtrace")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo")(lambda token_rewards, mask, config, values: (mask, mask))

    @register_advantage_estimator("test_negated_rewards")
    def negated(token_rewards, mask, config, values):
        return -token_rewards * mask, token_rewards * mask

    try:
        adv, _ = get_advantage_estimator("test_negated_rewards")(TOKEN_REWARDS, MASK, AdvantageConfig())
        torch.testing.assert_close(adv, -TOKEN_REWARDS, **TOL)
    finally:
        del ADVANTAGE_ESTIMATORS["test_negated_rewards"]


def test_public_names_resolve():
    for name in ops.__all__:
        assert getattr(ops, name) is not None
    assert "KL_ESTIMATORS" not in ops.__all__ and "DPO_LOSS_TYPES" not in ops.__all__
