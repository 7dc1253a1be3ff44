"""Steps 5-6 read each row's prompt group from ``Rollout.group_ids``: a batch whose rows are shuffled gets the
contiguous batch's scores, advantages and gradient mask, permuted (the group mean that stands in for a row no
reward applies to, and the zero-std groups left out, included)."""

from __future__ import annotations

import torch

from rlhfkit.cli.main import COMMANDS
from rlhfkit.config.parse import parse_config
from rlhfkit.trainers.online.advantages import assign_rewards_and_advantages
from rlhfkit.trainers.online.rollout import Rollout

G, T = 3, 2
# Three prompts, three completions each, contiguous: group 0 scores [0, 1, 2]; group 1 [5, 5, 5], all equal
# (left out with --drop-zero-std-groups); group 2 [1, ?, 4] whose middle row no reward applies to (it takes the
# group's mean over the others, 2.5, and advantage 0).
SCORES = [0.0, 1.0, 2.0, 5.0, 5.0, 5.0, 1.0, 0.0, 4.0]
VALID = [True] * 7 + [False, True]
PERM = [7, 3, 0, 8, 5, 1, 6, 4, 2]  # row i of the shuffled batch is row PERM[i] of the contiguous one


def rollout(rows: list[int]) -> Rollout:
    B = len(rows)
    ones = torch.ones(B, T, dtype=torch.long)
    z = torch.zeros(B, T)
    return Rollout(
        query_ids=torch.ones(B, 2, dtype=torch.long),
        query_mask=torch.ones(B, 2, dtype=torch.long),
        response_ids=ones.clone(),
        response_mask=ones.clone(),
        action_mask=ones.clone(),
        loss_mask=ones.clone(),
        group_ids=torch.tensor([r // G for r in rows]),
        scores=torch.tensor([SCORES[r] for r in rows]),
        raw_scores=torch.tensor([SCORES[r] if VALID[r] else float("nan") for r in rows]),
        valid=torch.tensor([VALID[r] for r in rows]),
        finished=torch.ones(B, dtype=torch.bool),
        logprobs=torch.full((B, T), -1.0),
        ref_logprobs=torch.full((B, T), -1.2),
        values=None,
        turn_rewards=z,
        rewards=z,
        advantages=z,
        returns=z,
    )


def test_shuffled_rows_get_the_contiguous_advantages_and_mask_permuted():
    argv = "--model m --data d.jsonl --output-dir o --reward-fn arithmetic --num-generations 3 --batch-size 9"
    cfg = parse_config("rlhfkit grpo", COMMANDS["grpo"].config, f"{argv} --drop-zero-std-groups true".split())[0]
    contiguous_metrics, shuffled_metrics = {}, {}
    contiguous = assign_rewards_and_advantages(rollout(list(range(9))), cfg, 0.04, False, contiguous_metrics)
    shuffled = assign_rewards_and_advantages(rollout(PERM), cfg, 0.04, False, shuffled_metrics)
    # by hand, contiguous: group 0 (r - 1) / (1 + 1e-4); group 1 all 0 and left out; group 2's scores [1, 2.5, 4]
    # give (r - 2.5) / (1.5 + 1e-4), the row without a reward 0
    a0, a2 = 1 / (1 + 1e-4), 1.5 / (1.5 + 1e-4)
    by_hand = torch.tensor([-a0, 0.0, a0, 0.0, 0.0, 0.0, -a2, 0.0, a2])
    torch.testing.assert_close(contiguous.advantages, by_hand.unsqueeze(1).expand(9, T), rtol=0, atol=1e-6)
    assert contiguous.scores[7] == 2.5
    assert contiguous.loss_mask.sum(dim=1).tolist() == [2, 2, 2, 0, 0, 0, 2, 0, 2]
    # the shuffled batch: the same, row for row
    for name in ("scores", "rewards", "advantages", "returns", "loss_mask"):
        torch.testing.assert_close(getattr(shuffled, name), getattr(contiguous, name)[PERM], rtol=0, atol=1e-6)
    assert shuffled_metrics["rollout/zero_std_groups"] == contiguous_metrics["rollout/zero_std_groups"] == 1.0
