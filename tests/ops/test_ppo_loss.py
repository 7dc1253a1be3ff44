"""ops.ppo_loss, the whole PPO loss in one place, against a naive loop over tokens; and its policy-loss registry."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit import ops

TOL = dict(rtol=0, atol=1e-6)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


MASK = t([[1, 1, 0], [1, 0, 0]])
LP = t([[-1.0, -0.5, -9.0], [-2.0, -7.0, -7.0]])
OLD = t([[-1.3, -0.4, 0.0], [-1.5, 0.0, 0.0]])
ADV = t([[1.0, -2.0, 5.0], [0.5, 3.0, 3.0]])
ENT = t([[0.7, 0.2, 9.0], [1.1, 9.0, 9.0]])
REF = t([[-1.2, -0.6, 0.0], [-2.5, 0.0, 0.0]])
V = t([[0.5, 0.9, 0.0], [-0.2, 0.0, 0.0]])
V_OLD = t([[0.1, 1.0, 0.0], [0.0, 0.0, 0.0]])
RET = t([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
CONFIG = ops.PPOLossConfig(clip_eps=0.2, vf_coef=0.1, value_clip=0.2, entropy_coef=0.01, kl_coef=0.05)
REAL = [(0, 0), (0, 1), (1, 0)]


def naive(config: ops.PPOLossConfig) -> dict[str, float]:
    """Token by token, in plain floats, token-mean."""
    pg, vf, ent, kl, clipped = [], [], [], [], 0
    for b, s in REAL:
        lp, old, a = LP[b, s].item(), OLD[b, s].item(), ADV[b, s].item()
        ratio = math.exp(lp - old)
        surrogate = max(-a * ratio, -a * min(max(ratio, 1 - config.clip_eps), 1 + config.clip_eps))
        clipped += -a * min(max(ratio, 1 - config.clip_eps), 1 + config.clip_eps) > -a * ratio
        pg.append(surrogate)
        v, v_old, r = V[b, s].item(), V_OLD[b, s].item(), RET[b, s].item()
        v_clip = v_old + min(max(v - v_old, -config.value_clip), config.value_clip)
        vf.append(max((v - r) ** 2, (v_clip - r) ** 2))
        ent.append(ENT[b, s].item())
        d = REF[b, s].item() - lp
        kl.append(math.exp(d) - d - 1)
    n = len(REAL)
    out = {"policy": sum(pg) / n, "value": 0.5 * sum(vf) / n, "entropy": sum(ent) / n, "kl": sum(kl) / n}
    out["clipfrac"] = clipped / n
    out["total"] = (
        out["policy"]
        + config.vf_coef * out["value"]
        - config.entropy_coef * out["entropy"]
        + config.kl_coef * out["kl"]
    )
    return out


def test_the_whole_loss_by_hand():
    loss, terms = ops.ppo_loss(
        CONFIG, MASK, logprobs=LP, old_logprobs=OLD, advantages=ADV, entropy=ENT, ref_logprobs=REF,
        values=V, old_values=V_OLD, returns=RET,
    )  # fmt: skip
    expected = naive(CONFIG)
    for name in ("policy", "value", "entropy", "kl", "clipfrac", "total"):
        torch.testing.assert_close(getattr(terms, name), t(expected[name]), **TOL, msg=name)
    torch.testing.assert_close(loss, t(expected["total"]), **TOL)
    assert not terms.total.requires_grad


def test_the_policys_pass_and_the_value_functions_add_up_to_the_joint_loss():
    policy_inputs = dict(logprobs=LP, old_logprobs=OLD, advantages=ADV, entropy=ENT, ref_logprobs=REF)
    value_inputs = dict(values=V, old_values=V_OLD, returns=RET)
    joint, _ = ops.ppo_loss(CONFIG, MASK, **policy_inputs, **value_inputs)
    policy, policy_terms = ops.ppo_loss(CONFIG, MASK, **policy_inputs)
    value, value_terms = ops.ppo_loss(CONFIG, MASK, **value_inputs)
    torch.testing.assert_close(policy + value, joint, **TOL)
    assert policy_terms.value is None and value_terms.policy is None and value_terms.entropy is None
    torch.testing.assert_close(value, CONFIG.vf_coef * value_terms.value, **TOL)


def test_the_aggregation_reduces_the_policy_entropy_and_kl_terms_not_the_value_loss():
    config = ops.PPOLossConfig(aggregation="seq-mean-token-mean", vf_coef=0.1, entropy_coef=0.01, kl_coef=0.05)
    _, terms = ops.ppo_loss(
        config, MASK, logprobs=LP, old_logprobs=OLD, advantages=ADV, entropy=ENT, ref_logprobs=REF,
        values=V, old_values=V_OLD, returns=RET,
    )  # fmt: skip
    torch.testing.assert_close(terms.entropy, t(((0.7 + 0.2) / 2 + 1.1) / 2), **TOL)  # the mean of row means
    torch.testing.assert_close(terms.value, t(naive(config)["value"]), **TOL)  # a token mean


def test_policy_losses_come_from_the_registry():
    assert {"token", "sequence"} <= ops.POLICY_LOSSES.keys()
    config = ops.PPOLossConfig(policy_loss="sequence")
    _, terms = ops.ppo_loss(config, MASK, logprobs=LP, old_logprobs=OLD, advantages=ADV)
    per_token, _ = ops.sequence_ratio_policy_loss(LP, OLD, ADV, MASK, 0.2)
    torch.testing.assert_close(terms.policy, ops.aggregate_loss(per_token, MASK, "token-mean"), **TOL)
    with pytest.raises(ValueError, match="unknown policy loss 'nope'; choose one of token, sequence"):
        ops.ppo_loss(ops.PPOLossConfig(policy_loss="nope"), MASK, logprobs=LP, old_logprobs=OLD, advantages=ADV)
