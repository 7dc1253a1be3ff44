"""One source of truth for the algorithms: a newly registered advantage estimator or policy loss is at once a
valid choice of the online commands, its metadata drives the configs' checks and the trainer's predicates, and a
run with it trains through it."""

from __future__ import annotations

import pytest
import torch

from rlhfkit import ops
from rlhfkit.errors import UserError
from rlhfkit.ops import estimators, losses
from rlhfkit.trainers.online import train

from .conftest import parse, read_metrics
from .test_critic_free import FAST, task  # noqa: F401  (the fixture)

BASE = "--model m --data d.jsonl --output-dir out --reward-fn r.py:f"


@pytest.fixture
def registered():
    """Registers under fresh names and removes them afterwards; yields the names registered."""
    names: list[tuple[dict, str]] = []

    def register(kind: str, name: str, fn=None, **meta):
        if kind == "estimator":
            estimators.register_advantage_estimator(name, **meta)(fn or _centred)
            names.append((estimators.ADVANTAGE_ESTIMATORS, name))
        else:
            losses.register_policy_loss(name)(fn or ops.ppo_policy_loss_per_token)
            names.append((losses.POLICY_LOSSES, name))
        return name

    yield register
    for registry, name in names:
        registry.pop(name, None)


calls: list[int] = []


def _centred(token_rewards, mask, config, values):
    """s_b − mean_g, broadcast over the real tokens (REINFORCE with the group mean as the baseline)."""
    calls.append(token_rewards.shape[0])
    scores = torch.where(mask.bool(), token_rewards, 0.0).sum(dim=-1)
    groups = scores.view(-1, config.group_size)
    centred = (groups - groups.mean(dim=1, keepdim=True)).view(-1)
    return centred.unsqueeze(-1) * mask, scores.unsqueeze(-1) * mask


def test_a_registered_estimator_is_a_valid_choice_and_its_metadata_drives_the_checks(registered):
    with pytest.raises(UserError, match="--advantage must be one of"):
        parse("grpo", f"{BASE} --advantage centred_test")
    name = registered("estimator", "centred_test", compares_group=True)
    cfg = parse("grpo", f"{BASE} --advantage {name}")
    assert cfg.advantage.advantage == name and cfg.compares_group and not cfg.needs_critic
    with pytest.raises(UserError, match="compares the completions of a prompt"):
        parse("grpo", f"{BASE} --advantage {name} --num-generations 1")
    critic = registered("estimator", "critic_test", needs_critic=True)
    assert parse("ppo", f"{BASE} --advantage {critic}").needs_critic
    # a critic estimator needs `rlhfkit ppo`; the message lists the critic-free names, the new one among them
    with pytest.raises(UserError, match=f"needs a value function: use `?rlhfkit ppo`?, or one of .*{name}"):
        parse("grpo", f"{BASE} --advantage {critic}")


def test_a_registered_policy_loss_is_a_valid_importance_ratio(registered):
    with pytest.raises(UserError, match="--importance-ratio must be one of token, sequence"):
        parse("grpo", f"{BASE} --importance-ratio clipped_test")
    name = registered("policy loss", "clipped_test")
    assert parse("grpo", f"{BASE} --importance-ratio {name}").policy.importance_ratio == name
    with pytest.raises(ValueError, match="already registered"):
        losses.register_policy_loss("token")(ops.ppo_policy_loss_per_token)


def test_a_run_trains_through_a_registered_estimator(registered, task, tmp_path):  # noqa: F811
    model, prompts, rewards = task
    name = registered("estimator", "centred_run_test", compares_group=True)
    calls.clear()
    cfg = parse(
        "grpo",
        f"--model {model} --data {prompts} --output-dir {tmp_path} --reward-fn {rewards}:thanks --max-steps 2 "
        f"--advantage {name} --learning-rate 1e-3 {FAST}",
    )
    train(cfg)
    assert calls == [16, 16]  # once a step, on the whole batch
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all(r["grad_norm"] > 0 for r in rows)
    assert "rollout/zero_std_groups" in rows[0]  # a group estimator by its metadata
