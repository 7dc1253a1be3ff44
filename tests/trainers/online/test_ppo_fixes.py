"""The literature's PPO options on the tiny task: the EMA reference (Xu et al. 2024) and the value model
initialised from the reward model (Huang et al. 2024; Ouyang et al. 2022)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.errors import UserError
from rlhfkit.models.loading import load_reward_model, load_tokenizer
from rlhfkit.trainers.online import train
from rlhfkit.trainers.online.policy import Networks
from rlhfkit.trainers.online.run import build_models

from .conftest import ThanksScorer, parse, read_metrics
from .test_ppo_resume import make_reward_model

BASE = (
    "--reward-model none --batch-size 8 --max-new-tokens 6 --progress false --normalize-reward false "
    "--learning-rate 1e-3 --max-steps 4 --seed 3"
)
KEYS = ("kl/ref", "reward/score", "loss/policy", "policy/approx_kl", "loss/value")


def _run(model, prompts, out, flags: str) -> list[dict]:
    train(parse("ppo", f"--model {model} --data {prompts} --output-dir {out} {BASE} {flags}"), scorer=ThanksScorer())
    return read_metrics(out)


def test_ema_reference_with_alpha_one_is_copying_every_step(thanks_task, tmp_path):
    model, prompts = thanks_task
    ema = _run(model, prompts, tmp_path / "ema", "--ref-ema 1.0")
    copy = _run(model, prompts, tmp_path / "copy", "--ref-update-steps 1")
    frozen = _run(model, prompts, tmp_path / "frozen", "")
    for a, b in zip(ema, copy):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}
    # the reference follows the policy: the KL of the last step is that of one update, not of four
    assert ema[-1]["kl/ref"] < frozen[-1]["kl/ref"]
    half = _run(model, prompts, tmp_path / "half", "--ref-ema 0.5")
    assert half[0]["kl/ref"] == frozen[0]["kl/ref"] == 0.0
    assert half[1:] != frozen[1:]  # the reference moved after step 1


def test_ema_reference_resumes_where_it_was(thanks_task, tmp_path):
    """The moving reference is part of the checkpoint: resumed from step 2, the run ends as the uninterrupted
    one (a reference restarted from the initial policy would give other KL values from step 3 on)."""
    import shutil

    model, prompts = thanks_task
    full = _run(model, prompts, tmp_path / "full", "--ref-ema 0.5 --save-steps 2")
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-2", tmp_path / "cut" / "checkpoints" / "step-2")
    shutil.copy(tmp_path / "full" / "metrics.jsonl", tmp_path / "cut" / "metrics.jsonl")
    resumed = _run(model, prompts, tmp_path / "cut", "--ref-ema 0.5 --save-steps 2 --resume")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(full[2:], resumed[2:]):
        assert a["kl/ref"] == pytest.approx(b["kl/ref"], abs=1e-6, rel=1e-5), a["step"]


def test_ema_reference_options_are_checked(thanks_task, tmp_path):
    model, prompts = thanks_task
    with pytest.raises(UserError, match=r"--ref-ema must be in \[0, 1\]"):
        parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path} {BASE} --ref-ema 1.5")
    with pytest.raises(UserError, match="--ref-ema needs full fine-tuning"):
        parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path} {BASE} --ref-ema 0.1 --lora-r 4")


def test_value_model_starts_as_the_reward_model(thanks_task, tmp_path):
    """V(s_t), the value before response token t, is the reward model's score of prompt + response[:t]."""
    model, prompts = thanks_task
    rm = make_reward_model(model, tmp_path / "rm")
    cfg = parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path}/run {BASE} --value-model {rm}")
    tokenizer = load_tokenizer(str(model))
    actor_critic, _ = build_models(cfg, tokenizer)
    reward_model = load_reward_model(str(rm)).eval()
    prompt = tokenizer("Customer: my order is late\nAgent:")["input_ids"]
    response = tokenizer(" thanks we will help")["input_ids"]
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        values = actor_critic(ids, torch.ones_like(ids), len(response), networks=Networks.VALUE).values[0]  # [T]
        prefixes = [ids[:, : len(prompt) + t] for t in range(len(response))]
        scores = [reward_model(input_ids=p, attention_mask=torch.ones_like(p)).logits[0, 0] for p in prefixes]
    torch.testing.assert_close(values, torch.stack(scores), rtol=0, atol=1e-5)
