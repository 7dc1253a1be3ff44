"""Held-out evaluation during online RL: eval/ metrics at the due steps, measured with the run's own rewards,
written beside the training samples, and without changing the training run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.trainers.online import train
from tests.helpers import read_jsonl

from .conftest import PROMPTS, ThanksScorer, parse, read_metrics

BASE = (
    "--reward-model none --batch-size 8 --max-new-tokens 6 --progress false --normalize-reward false "
    "--learning-rate 1e-3 --max-steps 4"
)


def test_ppo_logs_eval_metrics_at_the_due_steps_with_the_scorers_values(thanks_task, tmp_path):
    model, prompts = thanks_task
    train(
        parse(
            "ppo",
            f"--model {model} --data {prompts} --output-dir {tmp_path} --eval-data {prompts} --eval-steps 3 {BASE}",
        ),
        scorer=ThanksScorer(),
    )
    rows = {r["step"]: r for r in read_metrics(tmp_path)}
    # every 3 steps and at the last one
    assert [s for s, r in rows.items() if "eval/reward/score" in r] == [3, 4]
    samples = read_jsonl(tmp_path / "eval_samples.jsonl")
    assert [s["step"] for s in samples] == [3] * len(PROMPTS) + [4] * len(PROMPTS)
    assert [s["prompt"] for s in samples[: len(PROMPTS)]] == PROMPTS
    for step in (3, 4):
        mine = [s for s in samples if s["step"] == step]
        # the scorer's own value of each written reply, averaged: the logged reward
        expected = sum(1.0 if "thanks" in s["response"] else -1.0 for s in mine) / len(mine)
        assert rows[step]["eval/reward/reward_model"] == pytest.approx(expected, abs=1e-6)
        assert rows[step]["eval/reward/score"] == pytest.approx(expected, abs=1e-6)
        assert all(s["rewards"]["reward_model"] == s["score"] for s in mine)
        lengths = [s["length"] for s in mine]
        assert all(1 <= n <= 6 for n in lengths)
        assert rows[step]["eval/response/length"] == pytest.approx(sum(lengths) / len(lengths))
        assert rows[step]["eval/kl/ref"] == pytest.approx(sum(s["kl"] for s in mine) / len(mine))
    # the policy moved between the two evaluations: its replies drift from the reference's
    assert rows[4]["eval/kl/ref"] != 0.0


def test_evaluation_leaves_the_training_run_unchanged(thanks_task, tmp_path):
    model, prompts = thanks_task
    never = f"--eval-data {prompts} --eval-steps -1 --gold-judge support --gold-steps 2"
    runs = (("plain", ""), ("evaluated", f"--eval-data {prompts} --eval-steps 1"), ("never", never))
    for name, extra in runs:
        train(
            parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path / name} {extra} {BASE}"),
            scorer=ThanksScorer(),
        )

    def training(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("eval/", "time/"))} for r in rows]

    plain, evaluated = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "evaluated")
    assert all("eval/reward/score" in r for r in evaluated)
    # --eval-steps -1: no held-out evaluation at all, while the gold judge still scores the --eval-data prompts
    never = read_metrics(tmp_path / "never")
    assert not any(k.startswith("eval/") for r in never for k in r)
    assert not (tmp_path / "never" / "eval_samples.jsonl").exists()
    assert [r["step"] for r in never if "reward/gold" in r] == [1, 2, 4]
    for name in ("evaluated", "never"):
        other = read_metrics(tmp_path / name)
        assert training(plain) == [{k: v for k, v in r.items() if k != "reward/gold"} for r in training(other)]
        a, b = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / name / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert [json.loads(x) for x in (tmp_path / "plain" / "samples.jsonl").read_text().splitlines()] == [
            json.loads(x) for x in (tmp_path / name / "samples.jsonl").read_text().splitlines()
        ]


REWARDS = """
def thanks(prompts, completions, **kwargs):
    return [1.0 if "thanks" in c else 0.0 for c in completions]

def short(prompts, completions, completion_ids, **kwargs):
    return [1.0 / len(ids) for ids in completion_ids]
"""


@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_critic_free_runs_log_each_reward_function_and_the_gold_judge(thanks_task, tmp_path, command):
    model, prompts = thanks_task
    (tmp_path / "rewards.py").write_text(REWARDS)
    train(
        parse(
            command,
            f"--model {model} --data {prompts} --output-dir {tmp_path}/run --eval-data {prompts} "
            f"--reward-fn {tmp_path}/rewards.py:thanks --reward-fn {tmp_path}/rewards.py:short --reward-weights 1,0.5 "
            "--gold-judge support --gold-steps 2 --batch-size 8 --num-generations 4 --max-new-tokens 6 "
            "--progress false --max-steps 2",
        )
    )
    last = read_metrics(tmp_path / "run")[-1]
    samples = read_jsonl(tmp_path / "run" / "eval_samples.jsonl")
    assert len(samples) == len(PROMPTS)  # one evaluation, at the end
    thanks = sum(1.0 if "thanks" in s["response"] else 0.0 for s in samples) / len(samples)
    assert last["eval/reward/thanks"] == pytest.approx(thanks, abs=1e-6)
    short = sum(s["rewards"]["short"] for s in samples) / len(samples)
    assert last["eval/reward/short"] == pytest.approx(short, abs=1e-6)
    assert last["eval/reward/score"] == pytest.approx(thanks + 0.5 * short, abs=1e-5)
    assert last["eval/reward/gold"] == pytest.approx(sum(s["gold"] for s in samples) / len(samples))
    assert "eval/kl/ref" in last
