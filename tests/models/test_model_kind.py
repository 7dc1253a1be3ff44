"""The right kind of model in each place: a reward model's directory given where a language model belongs
(the policy of every training command, a reference, a model to sample from) stops every command with the
same line before any weights load, as a causal LM given where a reward model belongs does."""

from __future__ import annotations

import json

import pytest

import rlhfkit
from rlhfkit.errors import UserError
from rlhfkit.models import loading

from ..helpers import run_cli, write_jsonl


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """A one-output sequence classifier on the tiny GPT-2, as `rlhfkit rm` saves one."""
    from rlhfkit.models.reward import build_reward_model

    out = tmp_path_factory.mktemp("tiny_rm")
    tokenizer = loading.load_tokenizer(str(tiny_model_dir))
    build_reward_model(str(tiny_model_dir), tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def no_weights(monkeypatch):
    """Any weights loaded fail the test: the check must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(loading, "load_pretrained", refuse)


def commands(rm, tmp_path) -> dict[str, list]:
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Q: {i}+1=\nA:"} for i in range(8)])
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "Q: 1+1=\nA:", "completion": " 2"}] * 4)
    prefs = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": "Q: 1+1=\nA:", "chosen": " 2", "rejected": " 3"}] * 4)
    out = ["--output-dir", tmp_path / "out"]
    rl = ["--data", prompts, *out, "--batch-size", 4, "--max-new-tokens", 4, "--progress", "false"]
    return {
        "sft": ["sft", "--model", rm, "--data", sft, *out],
        "dpo": ["dpo", "--model", rm, "--data", prefs, *out],
        "ppo": ["ppo", "--model", rm, "--reward-model", rm, *rl],
        "grpo": ["grpo", "--model", rm, "--reward-fn", "arithmetic", "--num-generations", 2, *rl],
        "rloo": ["rloo", "--model", rm, "--reward-fn", "arithmetic", "--num-generations", 2, *rl],
        "generate": ["generate", "--model", rm, "--data", prompts, "--output", tmp_path / "out.jsonl"],
        "eval": ["eval", "--model", rm, "--data", prompts, "--output", tmp_path / "eval.json"],
    }


@pytest.mark.parametrize("command", ["sft", "dpo", "ppo", "grpo", "rloo", "generate", "eval"])
def test_a_reward_model_as_the_policy_stops_every_command(reward_model_dir, tmp_path, capsys, no_weights, command):
    code, _, err = run_cli(capsys, *commands(reward_model_dir, tmp_path)[command])
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.strip() == (
        f"error: {reward_model_dir}: is a reward model (GPT2ForSequenceClassification), not a causal LM: a "
        "policy, reference or model to sample from must be a language model that generates text (e.g. the SFT "
        "model a reward model was trained from)"
    )
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_reward_model_as_the_reference_is_refused_too(reward_model_dir, tiny_model_dir, tmp_path):
    prompts = [{"prompt": f"Q: {i}+1=\nA:"} for i in range(4)]
    refused = r"is a reward model \(GPT2ForSequenceClassification\), not a causal LM"
    with pytest.raises(UserError, match=refused):
        rlhfkit.ppo(
            model=str(tiny_model_dir),
            ref_model=str(reward_model_dir),
            reward_fns=["arithmetic"],
            data=prompts,
            output_dir=tmp_path / "ppo",
            batch_size=4,
            progress=False,
        )
    with pytest.raises(UserError, match=refused):
        rlhfkit.evaluate(
            model=str(tiny_model_dir), reference_model=str(reward_model_dir), data=prompts, output=tmp_path / "e.json"
        )


def test_each_kind_passes_its_own_check_and_rlhfkits_marker_counts(reward_model_dir, tiny_model_dir, tmp_path):
    loading.check_kind(str(tiny_model_dir), "causal LM")
    loading.check_kind(str(reward_model_dir), "reward model")
    with pytest.raises(UserError, match=r"is a causal LM \(GPT2LMHeadModel\), not a reward model"):
        loading.check_kind(str(tiny_model_dir), "reward model")
    # a classifier whose config.json names no architecture, beside the score statistics `rlhfkit rm` writes
    bare = tmp_path / "bare"
    bare.mkdir()
    config = json.loads((reward_model_dir / "config.json").read_text())
    config.pop("architectures")
    (bare / "config.json").write_text(json.dumps(config))
    (bare / "model.safetensors").write_bytes((reward_model_dir / "model.safetensors").read_bytes())
    loading.check_kind(str(bare), "causal LM")  # nothing says what it is: left to load
    (bare / "reward_stats.json").write_text(json.dumps({"mean": 0.0, "std": 1.0, "count": 4}))
    with pytest.raises(UserError, match=r"is a reward model \(made by rlhfkit rm: reward_stats.json\)"):
        loading.check_kind(str(bare), "causal LM")
