"""Multi-turn rollouts through the engine: a policy that calls a tool, then answers. Every reply is sampled by
vLLM, the tool's answer is spliced between the replies, and the engine's log-probs of the policy's tokens line up
with the trainer's (zeros on the spliced tokens, which no one sampled)."""

from __future__ import annotations

import json

import pytest

import rlhfkit

from .conftest import needs_vllm

pytestmark = needs_vllm

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
USERS = [f"please give {n} the {i}" for n in ("alice", "bob", "carol", "dave") for i in ("apple", "book", "lamp")]


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def brevity(prompts, completions, completion_ids, **kwargs):
    return [1.0 / max(len(ids), 1) for ids in completion_ids]


@pytest.fixture(scope="module")
def tool_policy_dir(vllm_model_dir, tmp_path_factory):
    """The tiny Llama after SFT on conversations that call ``add``, read its answer and reply "ok"."""
    d = tmp_path_factory.mktemp("tool_policy")
    conversation = [
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "ok"},
    ]
    rows = [{"messages": [{"role": "user", "content": u}, *conversation]} for u in USERS] * 10
    (d / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rlhfkit.sft(
        model=str(vllm_model_dir), data=str(d / "sft.jsonl"), output_dir=str(d / "policy"), max_steps=150,
        batch_size=16, learning_rate=3e-3, progress=False,
    )  # fmt: skip
    return d / "policy"


def test_a_tool_calling_run_samples_every_turn_through_the_engine(tool_policy_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": u}]}) + "\n" for u in USERS))
    runs = {}
    for use_vllm in (False, True):
        out = tmp_path / ("vllm" if use_vllm else "own")
        rlhfkit.grpo(
            model=str(tool_policy_dir), data=str(prompts), output_dir=out, reward_fns=[brevity], tools=[add],
            max_turns=3, max_steps=2, batch_size=8, num_generations=4, max_new_tokens=96, learning_rate=1e-3,
            temperature=0.3, seed=0, use_vllm=use_vllm, progress=False,
        )  # fmt: skip
        runs[use_vllm] = [json.loads(line) for line in open(out / "metrics.jsonl")]
    for rows in runs.values():  # the SFT habit, sampled cool: a call, the tool's answer, a final reply
        assert all(r["rollout/tool_calls"] >= 0.75 and r["rollout/turns"] >= 1.75 for r in rows), [
            (r["rollout/tool_calls"], r["rollout/turns"], r["response/length"]) for r in rows
        ]
    vllm = runs[True]
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in vllm), [r["rollout/logprob_diff"] for r in vllm]
    assert "rollout/logprob_diff" not in runs[False][0]
