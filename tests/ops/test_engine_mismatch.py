import math

import pytest
import torch

from rlhfkit.ops import PPOLossConfig, logprob_gap, ppo_loss, truncated_importance_weights


def test_gap_is_the_mean_absolute_difference_over_the_mask():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]], dtype=torch.float64)
    engine = torch.tensor([[-1.5, -2.0, -2.0], [-0.25, -99.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    # |0.5| + 0 + |1| + |0.25| over 4 tokens; the masked ones (99 apart) do not count
    assert logprob_gap(trainer, engine, mask).item() == pytest.approx(1.75 / 4, abs=1e-12)


def test_importance_weights_by_hand_capped_and_one_on_padding():
    trainer = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]], dtype=torch.float64)
    engine = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.8)]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    w = truncated_importance_weights(trainer, engine, mask, cap=1.5)
    # 0.5 / 0.25 = 2 -> capped at 1.5; 0.9 / 0.9 = 1; padding -> 1 (its 0.25 would not count anyway)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.0, 1.0]], dtype=torch.float64), rtol=0, atol=1e-12)
    w = truncated_importance_weights(trainer, engine, torch.ones_like(mask), cap=10.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.25]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_importance_weights_carry_no_gradient_and_need_a_positive_cap():
    trainer = torch.zeros(1, 2, requires_grad=True)
    assert not truncated_importance_weights(trainer, torch.zeros(1, 2), torch.ones(1, 2), 2.0).requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(trainer, torch.zeros(1, 2), torch.ones(1, 2), 0.0)


def test_ppo_loss_weighs_each_tokens_policy_loss_by_the_capped_weight():
    # ratio 1 (logprobs = old): the token loss is -A_t, times w_t = min(pi_old / pi_engine, C)
    old = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]], dtype=torch.float64)
    engine = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.8)]], dtype=torch.float64)
    advantages = torch.tensor([[2.0, -1.0, 4.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    config = PPOLossConfig(importance_sampling_cap=1.5, aggregation="token-mean")
    inputs = dict(logprobs=old.clone(), old_logprobs=old, advantages=advantages)
    loss, terms = ppo_loss(config, mask, engine_logprobs=engine, **inputs)
    # w = (2 -> 1.5, 1, 0.25): (-2 * 1.5 + 1 * 1 - 4 * 0.25) / 3
    assert loss.item() == pytest.approx((-3.0 + 1.0 - 1.0) / 3, abs=1e-12)
    assert terms.policy.item() == pytest.approx(-1.0, abs=1e-12)
    # no cap, or no engine log-probs: the plain loss (-2 + 1 - 4) / 3
    plain = (-2.0 + 1.0 - 4.0) / 3
    assert ppo_loss(PPOLossConfig(), mask, engine_logprobs=engine, **inputs)[0].item() == pytest.approx(plain)
    assert ppo_loss(config, mask, **inputs)[0].item() == pytest.approx(plain)
