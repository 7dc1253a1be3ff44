"""--whiten-rewards (Huang et al. 2024): the per-token rewards, the KL penalty included, are divided by their std
over the batch's real tokens before GAE, their mean kept; the critic-free estimators never see it."""

from __future__ import annotations

import torch

from rlhfkit.cli.main import COMMANDS
from rlhfkit.config.parse import parse_config
from rlhfkit.trainers.online.advantages import assign_rewards_and_advantages
from rlhfkit.trainers.online.rollout import Rollout

B, T = 3, 4
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])


def rollout(values: bool) -> Rollout:
    z = torch.zeros(B, T)
    logprobs = torch.tensor([[-1.0, -2.0, -0.5, -1.0], [-0.2, -3.0, 0.0, 0.0], [-1.5, -0.1, -0.7, 0.0]])
    return Rollout(
        query_ids=torch.ones(B, 2, dtype=torch.long),
        query_mask=torch.ones(B, 2, dtype=torch.long),
        response_ids=MASK.clone(),
        response_mask=MASK.clone(),
        action_mask=MASK.clone(),
        loss_mask=MASK.clone(),
        group_ids=torch.zeros(B, dtype=torch.long),  # one prompt's completions (GRPO's group of 3 below)
        scores=torch.tensor([2.0, -1.0, 0.5]),
        raw_scores=torch.tensor([2.0, -1.0, 0.5]),
        valid=torch.ones(B, dtype=torch.bool),
        finished=torch.ones(B, dtype=torch.bool),
        logprobs=logprobs,
        ref_logprobs=logprobs - 0.3 * MASK,
        values=torch.full((B, T), 0.25) * MASK if values else None,
        turn_rewards=z,
        rewards=z,
        advantages=z,
        returns=z,
    )


def assigned(command: str, argv: str) -> Rollout:
    required = "--model m --data d.jsonl --output-dir o " + (
        "--reward-model rm" if command == "ppo" else "--reward-fn arithmetic"
    )
    cfg = parse_config(f"rlhfkit {command}", COMMANDS[command].config, f"{required} {argv}".split())[0]
    return assign_rewards_and_advantages(rollout(cfg.needs_critic), cfg, 0.1, cfg.needs_critic, {})


def test_whitened_rewards_keep_their_mean_and_have_unit_std_over_real_tokens():
    plain, whitened = assigned("ppo", ""), assigned("ppo", "--whiten-rewards true")
    m = MASK.bool()
    r, w = plain.rewards[m].double(), whitened.rewards[m].double()
    # by hand: (r - mean) / std + mean, the std unbiased over the 9 real tokens
    expected = (r - r.mean()) / r.std() + r.mean()
    torch.testing.assert_close(w, expected, rtol=1e-5, atol=1e-6)
    assert abs(w.std().item() - 1.0) < 1e-5 and abs(w.mean().item() - r.mean().item()) < 1e-6
    assert (whitened.rewards[~m] == 0).all()  # padding stays out
    assert not torch.allclose(plain.advantages, whitened.advantages)  # GAE sees the whitened rewards


def test_critic_free_estimators_ignore_it():
    plain, asked = (
        assigned("grpo", "--num-generations 3 --batch-size 3"),
        assigned("grpo", "--num-generations 3 --batch-size 3 --whiten-rewards true"),
    )
    torch.testing.assert_close(plain.rewards, asked.rewards)
    torch.testing.assert_close(plain.advantages, asked.advantages)
    assert plain.advantages.abs().sum() > 0  # the group's scores differ: advantages that whitening could change
