"""GRPO and RLOO on the online loop: Python reward functions, group sampling, no critic, no reference when
beta = 0, the reward functions' errors, and exact resume."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import rlhfkit
from rlhfkit.errors import UserError
from rlhfkit.trainers.online import train
from rlhfkit.trainers.online.run import build_models
from rlhfkit.trainers.online.trainer import OnlineTrainer

from .conftest import PROMPTS, parse, read_metrics

REWARDS = """
def thanks(prompts, completions, **kwargs):
    return [1.0 if "thanks" in c else 0.0 for c in completions]

def short(prompts, completions, completion_ids, **kwargs):
    return [1.0 / len(ids) for ids in completion_ids]

def constant(prompts, completions, **kwargs):
    return [1.0] * len(completions)

def lamp_abstains(prompts, completions, **kwargs):
    return [None if "lamp" in p else float("thanks" in c) for p, c in zip(prompts, completions)]

def raises(prompts, completions, **kwargs):
    raise KeyError("answer")

def too_short(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)

def text(prompts, completions, **kwargs):
    return ["good"] * len(completions)
"""
FAST = "--batch-size 16 --num-generations 4 --max-new-tokens 8 --progress false"


@pytest.fixture(scope="module")
def task(thanks_task, tmp_path_factory):
    """(policy, prompts with an 'answer' column, reward file)."""
    model, _ = thanks_task
    d = tmp_path_factory.mktemp("critic_free")
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "answer": str(i)}) + "\n" for i, p in enumerate(PROMPTS)))
    (d / "rewards.py").write_text(REWARDS)
    return model, prompts, d / "rewards.py"


def first_last(rows, key, k=3):
    vals = [r[key] for r in rows]
    return sum(vals[:k]) / k, sum(vals[-k:]) / k


@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_reward_rises_with_a_python_reward_function(task, tmp_path, command, caplog):
    model, prompts, rewards = task
    cfg = parse(
        command,
        f"--model {model} --data {prompts} --output-dir {tmp_path} --reward-fn {rewards}:thanks "
        f"--max-steps 15 --learning-rate 3e-3 {FAST}",
    )
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        train(cfg)
    assert caplog.messages[-1] == f"model saved to {tmp_path.resolve()}"
    rows = read_metrics(tmp_path)
    start, end = first_last(rows, "reward/score")
    assert end > start + 0.4, (start, end)  # from about 0.2 ('thanks' in a fifth of the replies) towards 1
    last = rows[-1]
    # the rate each step used: the configured one at step 1, then linear decay (as every trainer logs it)
    assert rows[0]["step"] == 1 and rows[0]["learning_rate"] == pytest.approx(3e-3)
    assert last["reward/thanks"] == last["reward/score"]
    assert "rollout/zero_std_groups" in last and "kl/ref" in last and "policy/clipfrac" in last
    assert "loss/value" not in last and "value/explained_variance" not in last  # no critic
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.model_type == "gpt2"


def test_no_critic_and_no_reference_without_a_kl_term(task, tmp_path):
    model, prompts, rewards = task
    from rlhfkit.models.loading import load_tokenizer

    tok = load_tokenizer(str(model))
    argv = f"--model {model} --data {prompts} --output-dir {tmp_path} --reward-fn {rewards}:thanks {FAST}"
    actor_critic, reference = build_models(parse("grpo", argv + " --kl-coef 0"), tok)
    assert reference is None and not actor_critic.has_critic
    assert not any("value" in name for name, _ in actor_critic.named_parameters())
    _, reference = build_models(parse("grpo", argv), tok)  # beta 0.04 in the loss: a frozen copy
    assert reference is not None
    actor_critic, reference = build_models(parse("ppo", argv + " --advantage grpo --kl-coef 0"), tok)
    assert reference is None and not actor_critic.has_critic  # ppo's loop with a critic-free estimator
    train(parse("ppo", argv + " --advantage grpo --kl-coef 0 --max-steps 2 --learning-rate 1e-3"))
    last = read_metrics(tmp_path)[-1]
    assert "kl/ref" not in last and "loss/value" not in last and last["kl/coef"] == 0.0


def test_reward_functions_get_the_extra_columns_and_completion_ids(task, tmp_path, monkeypatch):
    """kwargs carry each extra column as a list aligned with prompts (repeated G times) and completion_ids."""
    model, prompts, _ = task
    calls = []

    def recording(prompts, completions, **kwargs):
        calls.append((list(prompts), list(completions), kwargs))
        return [0.0] * len(completions)

    rlhfkit.grpo(
        model=str(model),
        data=str(prompts),
        output_dir=tmp_path,
        reward_fns=[recording],
        max_steps=1,
        batch_size=8,
        num_generations=4,
        max_new_tokens=6,
        progress=False,
    )
    (batch_prompts, completions, kwargs), *_ = calls
    assert set(kwargs) == {"answer", "completion_ids", "trainer_state"}
    assert kwargs["trainer_state"].global_step == 0 and kwargs["trainer_state"].max_steps == 1
    answer_of = {p: str(i) for i, p in enumerate(PROMPTS)}
    assert kwargs["answer"] == [answer_of[p] for p in batch_prompts]
    assert batch_prompts[:4] == [batch_prompts[0]] * 4 and batch_prompts[4:] == [batch_prompts[4]] * 4  # groups
    assert len(kwargs["completion_ids"]) == len(completions) == 8
    assert all(isinstance(i, int) for ids in kwargs["completion_ids"] for i in ids)
    assert "<python function" in (tmp_path / "config.yaml").read_text()  # a callable is named, not pickled


def test_a_trl_chat_reward_function_runs_unchanged_on_chat_prompts(task, tmp_path):
    """TRL's quick-start shape: keyword arguments, completions as assistant message lists for chat prompts."""
    model, _, _ = task
    seen = []

    def reward_thanks(completions, **kwargs):
        seen.append(completions)
        return [1.0 if "thanks" in completion[0]["content"] else 0.0 for completion in completions]

    chats = [{"prompt": [{"role": "user", "content": p}], "ground_truth": "thanks"} for p in PROMPTS]
    rlhfkit.grpo(
        model=str(model),
        data=chats,
        output_dir=tmp_path,
        reward_fns=[reward_thanks],
        max_steps=1,
        batch_size=8,
        num_generations=4,
        max_new_tokens=6,
        progress=False,
    )
    assert len(seen[0]) == 8 and all(c[0]["role"] == "assistant" and len(c) == 1 for c in seen[0])


def test_a_reward_function_the_call_cannot_fill_stops_the_run_before_any_model_loads(task, tmp_path):
    _, prompts, _ = task

    def scored(prompt, completion):  # positional names TRL does not pass, no **kwargs
        return [0.0]

    with pytest.raises(UserError, match=r"reward function 'scored' needs 'prompt', which it is not given") as e:
        rlhfkit.grpo(model=str(tmp_path / "no-model"), data=str(prompts), output_dir=tmp_path, reward_fns=[scored])
    assert "the columns of" in str(e.value) and "(answer)" in str(e.value)


def test_weighted_rewards_are_logged_each_and_summed(task, tmp_path):
    model, prompts, rewards = task
    train(
        parse(
            "grpo",
            f"--model {model} --data {prompts} --output-dir {tmp_path} --reward-fn {rewards}:thanks "
            f"--reward-fn {rewards}:short --reward-weights 1,0.5 --max-steps 2 --learning-rate 1e-3 {FAST}",
        )
    )
    for row in read_metrics(tmp_path):
        assert row["reward/score"] == pytest.approx(row["reward/thanks"] + 0.5 * row["reward/short"], abs=1e-6)


def test_zero_std_groups_are_counted_and_dropped(task, tmp_path):
    model, prompts, rewards = task
    base = f"--model {model} --data {prompts} --reward-fn {rewards}:constant --max-steps 1 {FAST}"
    train(parse("grpo", f"{base} --output-dir {tmp_path / 'kept'}"))
    kept = read_metrics(tmp_path / "kept")[-1]
    assert kept["rollout/zero_std_groups"] == 4  # 16 completions in 4 groups, every reward equal
    start = load_file(model / "model.safetensors")
    train(parse("grpo", f"{base} --output-dir {tmp_path / 'dropped'} --drop-zero-std-groups --kl-coef 0"))
    dropped = read_metrics(tmp_path / "dropped")[-1]
    assert dropped["loss/policy"] == 0.0 and dropped["grad_norm"] == 0.0  # nothing left to learn from
    end = load_file(tmp_path / "dropped" / "model.safetensors")
    assert all(torch.equal(start[k], end[k]) for k in start)


def test_rows_no_reward_applies_to_get_zero_advantage(task, tmp_path, monkeypatch):
    model, prompts, rewards = task
    seen = []
    make_rollout = OnlineTrainer.make_rollout

    def recording(self, batch):
        experience = make_rollout(self, batch)
        seen.append((batch.prompts, experience.rollout, experience.metrics))
        return experience

    monkeypatch.setattr(OnlineTrainer, "make_rollout", recording)
    train(
        parse(
            "grpo",
            f"--model {model} --data {prompts} --output-dir {tmp_path} --reward-fn {rewards}:lamp_abstains "
            f"--max-steps 6 --learning-rate 1e-3 --batch-size 24 --num-generations 4 --max-new-tokens 8 "
            "--progress false",
        )
    )
    lamp_rows = 0
    for batch_prompts, rollout, metrics in seen:
        for i, prompt in enumerate(batch_prompts):
            if "lamp" in prompt:
                lamp_rows += 1
                assert torch.all(rollout.advantages[i] == 0) and torch.all(rollout.loss_mask[i] == 0)
                assert torch.isnan(rollout.raw_scores[i])
        assert ("reward/unscored_fraction" in metrics) == any("lamp" in p for p in batch_prompts)
    assert lamp_rows > 0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises", r"prompts\.jsonl: rows .*: reward function 'raises' raised KeyError: 'answer'"),
        ("too_short", r"reward function 'too_short' returned 15 values for 16 completions"),
        ("text", r"prompts\.jsonl: line \d+: reward function 'text' returned 'good', not a finite number or None"),
        ("missing", r"--reward-fn .*rewards\.py:missing: .*rewards\.py has no 'missing'"),
    ],
)
def test_a_bad_reward_function_stops_the_run_with_one_line(task, tmp_path, capsys, name, message):
    from rlhfkit.cli.main import main

    model, prompts, rewards = task
    code = main(
        ["grpo", "--model", str(model), "--data", str(prompts), "--output-dir", str(tmp_path), "--reward-fn",
         f"{rewards}:{name}", "--max-steps", "2", "--save-steps", "1", *FAST.split()]
    )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "model.safetensors").exists()


def test_group_and_batch_rules_are_checked_up_front(task, tmp_path):
    model, prompts, rewards = task
    base = f"--model {model} --data {prompts} --output-dir {tmp_path} --reward-fn {rewards}:thanks"
    with pytest.raises(UserError, match="--batch-size 10 must be a multiple of --num-generations 4"):
        parse("grpo", f"{base} --batch-size 10 --num-generations 4")
    with pytest.raises(UserError, match="needs --num-generations >= 2"):
        parse("rloo", f"{base} --num-generations 1")
    with pytest.raises(UserError, match="--advantage gae needs a value function: use rlhfkit ppo"):
        parse("grpo", f"{base} --advantage gae")
    with pytest.raises(UserError, match="give --reward-model or at least one --reward-fn"):
        parse("grpo", f"--model {model} --data {prompts} --output-dir {tmp_path}")
    # PPO with a critic-free estimator has no value function for a value model to be
    with pytest.raises(UserError, match="--value-model is the value function of a critic, and --advantage rloo"):
        parse("ppo", f"{base} --advantage rloo --num-generations 2 --batch-size 4 --value-model {model}")
    parse("ppo", f"{base} --advantage gae --value-model {model}")
    with pytest.raises(UserError, match="--reward-weights has 2 values for 1 rewards"):
        parse("grpo", f"{base} --reward-weights 1,2")


def grpo_cmd(model, prompts, rewards, out, *extra):
    flags = f"--reward-fn {rewards}:thanks --max-steps 6 --learning-rate 1e-3 --save-steps 2 --seed 3 {FAST}"
    return [sys.executable, "-m", "rlhfkit", "grpo", "--model", str(model), "--data", str(prompts),
            "--output-dir", str(out), *flags.split(), *extra]  # fmt: skip


@pytest.mark.long  # two processes resume GRPO after a kill in the suite (test_distributed_online.py)
def test_grpo_resume_after_kill_matches_uninterrupted(task, tmp_path):
    model, prompts, rewards = task
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(grpo_cmd(model, prompts, rewards, full), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(
        grpo_cmd(model, prompts, rewards, killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "step-2" / "meta.json").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "model.safetensors").exists()
    subprocess.run(grpo_cmd(model, prompts, rewards, killed, "--resume"), check=True, env=env, capture_output=True)
    a, b = load_file(full / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    for ra, rb in zip(read_metrics(full), read_metrics(killed), strict=True):
        for key in ("reward/score", "kl/ref", "loss/policy", "loss/kl", "rollout/zero_std_groups"):
            assert ra[key] == rb[key], (ra["step"], key)
