"""PPO --resume after SIGKILL ends exactly where the uninterrupted run ends (same seed, CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file

from .conftest import read_metrics


def make_reward_model(policy_dir, out_dir):
    from rlhfkit.models.loading import load_tokenizer
    from rlhfkit.models.reward import build_reward_model

    tok = load_tokenizer(str(policy_dir))
    torch.manual_seed(0)
    rm = build_reward_model(str(policy_dir), tok)
    rm.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def ppo_cmd(model, rm, prompts, out, *extra):
    return [
        sys.executable,
        "-m",
        "rlhfkit.cli.main",
        "ppo",
        "--model",
        str(model),
        "--reward-model",
        str(rm),
        "--data",
        str(prompts),
        "--output-dir",
        str(out),
        "--max-steps",
        "6",
        "--batch-size",
        "8",
        "--max-new-tokens",
        "6",
        "--learning-rate",
        "1e-3",
        "--save-steps",
        "2",
        "--progress",
        "false",
        "--target-kl",
        "0.5",
        "--seed",
        "3",
        *extra,
    ]


def run_env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def test_resume_after_kill_matches_uninterrupted(thanks_task, tmp_path):
    model, prompts = thanks_task
    rm = make_reward_model(model, tmp_path / "rm")
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(ppo_cmd(model, rm, prompts, full), check=True, env=run_env(), capture_output=True)

    proc = subprocess.Popen(
        ppo_cmd(model, rm, prompts, killed), env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "step-2" / "meta.json").exists():
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "model.safetensors").exists()  # it really was cut off
    subprocess.run(ppo_cmd(model, rm, prompts, killed, "--resume"), check=True, env=run_env(), capture_output=True)

    a, b = load_file(full / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0)
    # the value head and controller state also continued exactly: identical metric curves
    ma, mb = read_metrics(full), read_metrics(killed)
    assert [r["step"] for r in mb] == list(range(1, 7))
    for ra, rb in zip(ma, mb):
        for key in ("reward/score", "kl/ref", "kl/coef", "loss/value", "loss/policy"):
            assert ra[key] == rb[key], (ra["step"], key)
