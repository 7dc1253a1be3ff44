"""Online RL on two processes (gloo, CPU): distinct prompts and samples per process, whole-batch statistics
equal to one process's computation on the gathered batch, learning, exact resume after a kill of the whole
job, and a bounded exit when one process dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit import ops
from rlhfkit.training.stream import IndexStream
from tests.helpers import launch, launcher, one_thread_env, write_jsonl

RECORDER = Path(__file__).with_name("record_steps.py")
REWARD = """
def thanks(prompts, completions, **kwargs):
    return [1.0 if "thanks" in c else -1.0 for c in completions]
"""


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dist_reward") / "reward.py"
    path.write_text(REWARD)
    return path


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def record(args: list, out: Path) -> list[list[dict]]:
    cmd = launcher(2) + [str(RECORDER), *map(str, args), "--output-dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(out / f"record-rank-{r}.pt", weights_only=False) for r in (0, 1)]


def test_ppo_ranks_split_the_batch_and_share_whole_batch_statistics(thanks_task, reward_file, tmp_path):
    model, prompts = thanks_task
    n_prompts = sum(1 for _ in open(prompts))
    args = ["ppo", "--model", model, "--data", prompts, "--reward-fn", f"{reward_file}:thanks", "--batch-size", 8]
    args += ["--max-new-tokens", 8, "--max-steps", 4, "--learning-rate", "1e-3", "--progress", "false"]
    args += ["--kl-coef", "0.2", "--target-kl", "0.01", "--kl-horizon", "50", "--seed", "7"]
    ranks = record(args, tmp_path)
    stream = IndexStream(n_prompts, seed=7)
    controller = ops.AdaptiveKLController(0.2, 0.01, 50)
    for step, (r0, r1) in enumerate(zip(*ranks), start=1):
        # the same global data order as one process, each rank its own half
        assert r0["rows"] + r1["rows"] == stream.take(8) and not set(r0["rows"]) & set(r1["rows"])
        # every rank gathered the same whole batch and computed the same credit from it
        for part in ("before", "after"):
            for key, value in r0[part].items():
                assert torch.equal(value, r1[part][key]), (step, part, key)
        # ... which is what one process computes on that batch: KL-shaped rewards, GAE, global whitening
        b, a = r0["before"], r0["after"]
        mask = b["response_mask"].float()
        kl = ops.kl_penalty(b["logprobs"], b["ref_logprobs"], "k1") * mask
        rewards = ops.per_token_rewards(b["scores"], kl, mask, r0["beta"])
        advantages, returns = ops.gae(rewards, b["values"], mask, 1.0, 0.95)
        torch.testing.assert_close(a["rewards"], rewards)
        torch.testing.assert_close(a["returns"], returns)
        torch.testing.assert_close(a["advantages"], ops.masked_whiten(advantages, mask) * mask)
        # beta: both ranks hold the same value, updated from the whole batch's KL
        assert r0["beta"] == pytest.approx(controller.value)
        whole_kl = float(((b["logprobs"] - b["ref_logprobs"]) * mask).sum(dim=1).mean())
        assert r0["kl/ref"] == pytest.approx(whole_kl, abs=1e-6)
        controller.update(whole_kl, n_steps=8)
        assert r0["beta_after"] == r1["beta_after"] == pytest.approx(controller.value)
    assert controller.value != 0.2  # beta moved: the adaptive controller really ran
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {row["rank"] for row in samples} == {0, 1}  # every process's samples, written once


def test_grpo_ranks_draw_different_completions_for_the_same_prompt(thanks_task, reward_file, tmp_path):
    model, _ = thanks_task
    one_prompt = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "Customer: my order is late\nAgent:"}] * 8)
    args = ["grpo", "--model", model, "--data", one_prompt, "--reward-fn", f"{reward_file}:thanks"]
    args += ["--batch-size", 8, "--num-generations", 4, "--max-new-tokens", 8, "--max-steps", 2]
    args += ["--progress", "false"]
    r0, _ = record(args, tmp_path / "run")
    for step in r0:
        ids = step["before"]["response_ids"]
        assert not torch.equal(ids[:4], ids[4:])  # same prompt, rank 0's group vs rank 1's group
        # group advantages over each prompt's 4 completions, whose members sit on one process
        after = step["after"]
        mask = after["response_mask"].float()
        config = ops.AdvantageConfig(group_size=4, scale="group")
        advantages, _ = ops.get_advantage_estimator("grpo")(after["rewards"], mask, config, None)
        torch.testing.assert_close(after["advantages"], advantages)
        assert torch.equal(step["before"]["group_ids"], torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))


def grpo_args(model, prompts, reward_file, out, *extra) -> list:
    args = ["grpo", "--model", model, "--data", prompts, "--reward-fn", f"{reward_file}:thanks"]
    args += ["--batch-size", 16, "--num-generations", 4, "--max-new-tokens", 8, "--max-steps", 16]
    args += ["--learning-rate", "3e-3", "--save-steps", 4, "--progress", "false", "--output-dir", out, *extra]
    return args


def test_grpo_on_two_processes_learns_and_resumes_exactly_after_a_kill(thanks_task, reward_file, tmp_path):
    model, prompts = thanks_task
    whole = tmp_path / "whole"
    done = launch(grpo_args(model, prompts, reward_file, whole))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(whole)
    first = sum(r["reward/score"] for r in rows[:3]) / 3
    last = sum(r["reward/score"] for r in rows[-3:]) / 3
    assert last > first + 0.5, (first, last)  # learns: 'thanks' replies from ~30% towards all

    killed = tmp_path / "killed"
    job = subprocess.Popen(
        launcher(2) + ["-m", "rlhfkit", *map(str, grpo_args(model, prompts, reward_file, killed))],
        env=one_thread_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    marker = killed / "checkpoints" / "step-8" / "meta.json"
    deadline = time.monotonic() + 240
    while not marker.is_file() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # the whole job, launcher included, as a node failure would
    job.wait()
    assert job.returncode == -signal.SIGKILL and marker.is_file()
    assert not (killed / "model.safetensors").exists()  # killed mid-run, before the final model
    done = launch(grpo_args(model, prompts, reward_file, killed, "--resume"))
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = read_metrics(killed)
    assert [r["step"] for r in resumed] == list(range(1, 17))
    for a, b in zip(rows, resumed):
        for key in ("reward/score", "loss/policy", "kl/ref", "policy/entropy"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    w1, w2 = load_file(whole / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def rank_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of the worker with ``RANK=rank`` among the launcher's children."""
    for child in Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split():
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(child)
    return None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the worker through /proc (Linux)")
def test_a_dead_process_ends_the_job_with_an_error_within_the_timeout(thanks_task, reward_file, tmp_path):
    model, prompts = thanks_task
    out = tmp_path / "run"
    args = grpo_args(model, prompts, reward_file, out, "--dist-timeout", 60)
    args[args.index("--max-steps") + 1] = 10_000
    job = subprocess.Popen(
        launcher(2) + ["-m", "rlhfkit", *map(str, args)],
        env=one_thread_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (log.is_file() and log.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = rank_pid(job.pid, 1)
    assert victim is not None
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    _, err = job.communicate(timeout=120)
    elapsed = time.monotonic() - killed_at
    assert job.returncode != 0
    assert elapsed < 60, elapsed
    assert "rank: 1" in err or "process 1" in err, err[-2000:]
    print(f"job exited {elapsed:.1f}s after rank 1 was killed", file=sys.stderr)
