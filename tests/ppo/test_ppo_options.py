"""PPO options beyond the default path: reference refresh, separate value model, non-finite rewards."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.errors import UserError
from rlhfkit.trainers.ppo import train

from .conftest import ScoreOut, ThanksScorer, parse, read_metrics
from .test_ppo_resume import make_reward_model

BASE = "--reward-model none --batch-size 8 --max-new-tokens 6 --progress false --normalize-reward false --learning-rate 1e-3"


def test_reference_refresh_resets_kl(thanks_task, tmp_path):
    model, prompts = thanks_task
    train(parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 4 --ref-update-steps 2 {BASE}"),
          scorer=ThanksScorer())
    kl = {r["step"]: r["kl/ref"] for r in read_metrics(tmp_path)}
    # after the refresh at step 2 the policy that samples step 3 *is* the reference
    assert kl[1] == 0.0 and kl[3] == 0.0
    assert kl[2] != 0.0 and kl[4] != 0.0


def test_separate_value_model_from_reward_model(thanks_task, tmp_path):
    model, prompts = thanks_task
    rm = make_reward_model(model, tmp_path / "rm")
    train(parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path}/run --max-steps 3 --value-model {rm} {BASE}"),
          scorer=ThanksScorer())
    rows = read_metrics(tmp_path / "run")
    # the value model starts from the RM's head, so values are non-zero from the first step
    assert rows[0]["value/mean"] != 0.0
    assert all(r["loss/value"] > 0 for r in rows)


class NaNScorer(ThanksScorer):
    def score(self, prompts, responses, batch_size=32):
        return ScoreOut(torch.full((len(responses),), float("nan")))


def test_non_finite_rewards_skip_then_stop(thanks_task, tmp_path, capsys):
    model, prompts = thanks_task
    cfg = parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 5 --save-steps 1 "
                       f"--reward-clip none {BASE}")
    with pytest.raises(UserError, match="non-finite"):
        train(cfg, scorer=NaNScorer())
    assert "skipped" in capsys.readouterr().err
    # skipped updates leave the weights as they were: whatever was checkpointed is finite
    from safetensors.torch import load_file

    for ckpt in (tmp_path / "checkpoints").glob("step-*"):
        assert all(torch.isfinite(t).all() for t in load_file(ckpt / "actor_critic.safetensors").values())


def test_non_finite_weights_are_never_saved(tmp_path):
    from rlhfkit.training.checkpoint import Checkpointer

    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight[0, 0] = float("inf")
    with pytest.raises(FloatingPointError):
        Checkpointer(tmp_path).save(1, {"model": layer}, {})
    assert Checkpointer(tmp_path).latest() is None
