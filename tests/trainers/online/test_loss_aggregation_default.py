"""The loss `rlhfkit grpo` builds by default weighs every token the same: a long wrong completion's tokens get the
whole penalty, not one shared by its length (the length bias of averaging each completion first)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit import ops
from rlhfkit.cli.main import COMMANDS
from rlhfkit.config.parse import parse_config
from rlhfkit.trainers.online.update import loss_config

REQUIRED = "--model m --data d.jsonl --reward-fn arithmetic --output-dir o"
SHORT, LONG, T = 2, 8, 8  # a right answer of 2 tokens, a wrong ramble of 8
MASK = torch.tensor([[1.0] * SHORT + [0.0] * (T - SHORT), [1.0] * LONG], dtype=torch.float64)
ADVANTAGES = torch.tensor([[1.0] * T, [-1.0] * T], dtype=torch.float64)  # [B, T], one value per row


def policy_gradient(argv: str) -> torch.Tensor:
    """d loss / d log-prob ``[B, T]`` of the policy loss the grpo command's config builds, at ratio 1."""
    cfg = parse_config("rlhfkit grpo", COMMANDS["grpo"].config, f"{REQUIRED} {argv}".split())[0]
    old = torch.full((2, T), -1.0, dtype=torch.float64)
    logprobs = old.clone().requires_grad_()
    # the loss the update builds from the run's options (the trainer's one loss function)
    loss, _ = ops.ppo_loss(
        loss_config(cfg, cfg.generation.max_new_tokens),
        MASK,
        logprobs=logprobs,
        old_logprobs=old,
        advantages=ADVANTAGES,
    )
    loss.backward()
    return logprobs.grad


def test_grpo_default_gives_a_long_wrong_completion_the_token_level_gradient():
    grad = policy_gradient("")
    # token level: d(-A·ρ)/dlp / (all real tokens) = -A / (SHORT + LONG), the same for every token
    expected = torch.tensor([[-1 / 10] * SHORT + [0.0] * (T - SHORT), [1 / 10] * LONG], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_averaging_each_completion_first_dilutes_the_long_one():
    grad = policy_gradient("--loss-aggregation seq-mean-token-mean")
    # -A / (B · L_i): the long wrong completion's tokens get 1/16 each, the short right one's 1/4
    assert grad[1, 0].item() == pytest.approx(1 / 16, abs=1e-12)
    assert grad[0, 0].item() == pytest.approx(-1 / 4, abs=1e-12)
