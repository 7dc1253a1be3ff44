"""Online RL on multi-turn rollouts (a scripted policy, so the conversations are known): only the policy's
tokens are trained, GAE runs across a tool's answer, an environment's failure stops the run with nothing of
that step written and the run then resumes exactly, and two processes train as one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlhfkit
from rlhfkit import ops
from rlhfkit.errors import UserError
from rlhfkit.trainers.online.rollout import action_order
from rlhfkit.trainers.online.trainer import OnlineTrainer
from tests.helpers import launcher, one_thread_env, write_jsonl
from tests.multiturn.scripted import ENVS, TOOLS, call_then_answer, install

SCRIPT = Path(__file__).with_name("scripted.py")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "tools.py").write_text(TOOLS)
    (tmp_path / "envs.py").write_text(ENVS)
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"what is {i} + {i + 1}?"} for i in range(8)])
    return tmp_path


@pytest.fixture
def credits(monkeypatch) -> list:
    """What ``assign_rewards_and_advantages`` made of each step's rollout."""
    seen = []
    original = OnlineTrainer.assign_rewards_and_advantages

    def recording(self, r, metrics):
        out = original(self, r, metrics)
        seen.append(out)
        return out

    monkeypatch.setattr(OnlineTrainer, "assign_rewards_and_advantages", recording)
    return seen


def common(files, out, **options):
    return dict(
        model=str(options.pop("model")),
        data=str(files / "prompts.jsonl"),
        output_dir=str(out),
        max_new_tokens=100,
        progress=False,
        **options,
    )


def test_only_the_policys_tokens_are_trained(monkeypatch, credits, tiny_model_dir, files):
    install(monkeypatch, call_then_answer)
    rlhfkit.grpo(
        **common(files, files / "run", model=tiny_model_dir),
        tools=[f"{files}/tools.py:add"],
        reward_fns=[f"{files}/tools.py:length"],
        batch_size=8,
        num_generations=4,
        max_steps=2,
        kl_coef=0.1,
        sample_steps=1,
    )
    for r in credits:
        context = (r.response_mask - r.action_mask).bool()  # the tool's message and the template around it
        assert context.any(dim=1).all()  # every row called the tool
        for name in ("logprobs", "ref_logprobs", "advantages", "rewards", "loss_mask"):
            assert not getattr(r, name)[context].any(), name
        assert r.advantages[r.action_mask.bool()].abs().sum() > 0  # the policy's tokens do get credit
    metrics = [json.loads(line) for line in (files / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["rollout/turns"] == 2 and metrics[-1]["rollout/tool_calls"] == 1
    assert metrics[-1]["rollout/tool_errors"] == 0 and metrics[-1]["rollout/truncated"] == 0
    sample = json.loads((files / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in sample["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert sample["messages"][2]["content"] == "5"


def test_gae_bootstraps_from_the_next_reply_across_a_tools_answer(monkeypatch, credits, tiny_model_dir, files):
    install(monkeypatch, call_then_answer)
    rlhfkit.ppo(
        **common(files, files / "run", model=tiny_model_dir),
        tools=[f"{files}/tools.py:add"],
        reward_fns=[f"{files}/tools.py:length"],
        batch_size=4,
        max_steps=1,
        kl_coef=0.1,
        gamma=0.9,
        lam=0.8,
    )
    [r] = credits
    mask = r.action_mask.float()
    order = action_order(mask)
    assert order is not None
    compact = lambda x: x.gather(1, order)  # noqa: E731
    advantages, returns = ops.gae(compact(r.rewards), compact(r.values), compact(mask), 0.9, 0.8)
    advantages = ops.masked_whiten(advantages, compact(mask)) * compact(mask)
    torch.testing.assert_close(compact(r.advantages), advantages)
    torch.testing.assert_close(compact(r.returns) * compact(mask), returns * compact(mask))
    # across the tool's tokens the first reply still gets the discounted credit of the answer that follows;
    # GAE on the raw layout would stop at the tool's message and give the first reply nothing of it
    naive, _ = ops.gae(r.rewards, r.values, mask, 0.9, 0.8)
    first_reply = mask.bool() & (torch.cumsum(1 - mask, dim=1) == 0)
    assert not naive[first_reply].any() and r.advantages[first_reply].abs().sum() > 0


def env_run(files, tiny_model_dir, out, **options):
    return rlhfkit.grpo(
        **common(files, out, model=tiny_model_dir),
        env=f"{files}/envs.py:Scored",
        batch_size=8,
        num_generations=4,
        max_steps=4,
        save_steps=2,
        learning_rate=1e-3,
        **options,
    )


def test_an_environment_failure_writes_nothing_of_its_step_and_the_run_resumes_exactly(
    monkeypatch, tiny_model_dir, files
):
    install(monkeypatch, lambda context, rng: ["yes", "no"][rng(2)])
    env_run(files, tiny_model_dir, files / "full")
    monkeypatch.setenv("RLHFKIT_TEST_FAIL_AFTER", "16")  # the third step's first reset (8 rows a step)
    with pytest.raises(UserError, match=r"prompts.jsonl: line \d+: environment Scored.reset raised ConnectionError"):
        env_run(files, tiny_model_dir, files / "broken")
    checkpoints = sorted(p.name for p in (files / "broken" / "checkpoints").iterdir())
    assert checkpoints == ["step-2"] and not (files / "broken" / "model.safetensors").exists()
    monkeypatch.delenv("RLHFKIT_TEST_FAIL_AFTER")
    env_run(files, tiny_model_dir, files / "broken", resume=True)
    a, b = load_file(files / "full" / "model.safetensors"), load_file(files / "broken" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    read = lambda out: [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    full, resumed = read(files / "full"), read(files / "broken")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for x, y in zip(full, resumed, strict=True):
        assert x["reward/env"] == y["reward/env"] and x["loss/policy"] == y["loss/policy"]
    assert len({m["reward/env"] for m in full}) > 1  # the episodes differ from step to step


def test_two_processes_train_as_one(tiny_model_dir, files):
    def run(nproc: int, out: Path):
        args = ["ppo", "--model", tiny_model_dir, "--data", files / "prompts.jsonl", "--output-dir", out]
        args += ["--tool", f"{files}/tools.py:add", "--reward-fn", f"{files}/tools.py:length"]
        args += ["--batch-size", 8, "--max-steps", 2, "--max-new-tokens", 100, "--learning-rate", "1e-3"]
        args += ["--progress", "false", "--kl-coef", "0.1"]
        cmd = launcher(nproc) + [str(SCRIPT), *map(str, args)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=one_thread_env())
        assert done.returncode == 0, done.stderr[-3000:]
        return load_file(out / "model.safetensors")

    one, two = run(1, files / "one"), run(2, files / "two")
    start = load_file(tiny_model_dir / "model.safetensors")
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-4  # it trained
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=1e-5)
    assert os.path.exists(files / "two" / "samples.jsonl")


def test_the_python_api_takes_tools_and_an_environment_as_python_objects(monkeypatch, tiny_model_dir, files):
    namespace: dict = {}
    exec(TOOLS + ENVS, namespace)
    install(monkeypatch, call_then_answer)
    result = rlhfkit.grpo(
        **common(files, files / "api", model=tiny_model_dir),
        tools=[namespace["add"]],
        env=namespace["Counter"],
        batch_size=4,
        num_generations=2,
        max_steps=1,
        max_turns=6,
    )
    # the tool answers the call, then the environment takes the replies without one, for its three turns
    assert result.metrics["rollout/tool_calls"] == 1 and result.metrics["rollout/turns"] == 4
    assert result.metrics["reward/env"] == 6.0
    config = (files / "api" / "config.yaml").read_text()
    assert "# tool: Python callables" in config and "# env: Python callables" in config
