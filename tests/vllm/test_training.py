"""GRPO / PPO with --use-vllm: the engine samples, the trainer learns as with its own sampler."""

from __future__ import annotations

import json

import pytest

import rlhfkit

from .conftest import needs_vllm

pytestmark = needs_vllm

RUN = dict(batch_size=16, num_generations=4, max_new_tokens=16, learning_rate=3e-3, seed=0, progress=False)


def brevity(prompts, completions, completion_ids, **kwargs):
    """1 / the reply's length in tokens (EOS included): a two-token "ok" scores 0.5, a long reply ~0.07."""
    return [1.0 / len(ids) for ids in completion_ids]


def metrics(path) -> list[dict]:
    return [json.loads(line) for line in open(path / "metrics.jsonl")]


def mean(rows, key, part):
    values = [r[key] for r in rows][part]
    return sum(values) / len(values)


def test_grpo_learns_brevity_through_the_engine_as_with_the_own_sampler(brief_policy_dir, prompts_file, tmp_path):
    """Same seeds, same steps: both runs move the reward from about half-short replies to mostly short ones;
    the vLLM run logs its weight syncs and the engine / trainer log-prob gap (fp32: rounding only)."""
    runs = {}
    for use_vllm in (False, True):
        out = tmp_path / ("vllm" if use_vllm else "own")
        rlhfkit.grpo(
            model=str(brief_policy_dir), data=str(prompts_file), output_dir=out, reward_fns=[brevity],
            max_steps=8, use_vllm=use_vllm, **RUN,
        )  # fmt: skip
        runs[use_vllm] = metrics(out)
    for rows in runs.values():
        start, end = mean(rows, "reward/score", slice(0, 2)), mean(rows, "reward/score", slice(-2, None))
        assert end > start + 0.1, (start, end)
        assert end > 0.4
    own, vllm = runs[False], runs[True]
    assert abs(mean(own, "reward/score", slice(-3, None)) - mean(vllm, "reward/score", slice(-3, None))) < 0.1
    assert all(r["time/weight_sync_s"] > 0 for r in vllm)  # the first step loads the start, then every update
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in vllm), [r["rollout/logprob_diff"] for r in vllm]
    assert "rollout/logprob_diff" not in own[0]


def test_ppo_with_lora_and_the_importance_sampling_cap(brief_policy_dir, prompts_file, tmp_path):
    """PPO with a value head, LoRA merged into the engine, every second update synced, the truncated
    importance weights on: the reward still rises, and the log-prob gap shows the engine's lag (nearly 0 on
    the steps right after a sync, larger on the others)."""
    rlhfkit.ppo(
        model=str(brief_policy_dir), data=str(prompts_file), output_dir=tmp_path, reward_fns=[brevity],
        max_steps=8, lora_r=8, lora_alpha=16.0, use_vllm=True, vllm_sync_steps=2,
        vllm_importance_sampling_cap=2.0, **{**RUN, "learning_rate": 2e-2, "num_generations": 1},
    )  # fmt: skip
    rows = metrics(tmp_path)
    synced = [r for r in rows if "time/weight_sync_s" in r]
    assert [r["step"] for r in synced] == [1, 3, 5, 7]
    lagging = [r["rollout/logprob_diff"] for r in rows if "time/weight_sync_s" not in r]
    assert max(r["rollout/logprob_diff"] for r in synced) < 1e-4
    assert min(lagging) > 1e-3, lagging
    start, end = mean(rows, "reward/score", slice(0, 2)), mean(rows, "reward/score", slice(-2, None))
    assert end > start, (start, end)


@pytest.mark.parametrize("command", ["rloo"])
def test_use_vllm_is_an_option_of_the_critic_free_commands_too(brief_policy_dir, prompts_file, tmp_path, command):
    getattr(rlhfkit, command)(
        model=str(brief_policy_dir), data=str(prompts_file), output_dir=tmp_path, reward_fns=[brevity],
        max_steps=2, use_vllm=True, **RUN,
    )  # fmt: skip
    assert all("rollout/logprob_diff" in r for r in metrics(tmp_path))


def test_two_processes_sample_with_an_engine_each_and_train_as_one(brief_policy_dir, prompts_file, tmp_path):
    """torchrun with two processes: each starts its own engine (its engine core in a process of its own), samples
    its half of the batch, and the engines take the weights of every update."""
    from tests.helpers import launch

    (tmp_path / "rewards.py").write_text(
        "def brevity(prompts, completions, completion_ids, **kwargs):\n"
        "    return [1.0 / len(ids) for ids in completion_ids]\n"
    )
    out = tmp_path / "two"
    args = ["grpo", "--model", brief_policy_dir, "--data", prompts_file, "--output-dir", out, "--use-vllm"]
    args += ["--reward-fn", f"{tmp_path}/rewards.py:brevity", "--batch-size", 16, "--num-generations", 4]
    args += ["--max-steps", 3, "--max-new-tokens", 16, "--learning-rate", "3e-3", "--progress", "false"]
    args += ["--vllm-gpu-memory-utilization", "0.1"]  # on a CPU: the share of memory each engine may count on
    done = launch(args, 2, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["time/weight_sync_s"] > 0 for r in rows)  # every update reached both engines
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows), [r["rollout/logprob_diff"] for r in rows]
    # the engines' own processes ended with the run (else `launch` would still be waiting on their output)
