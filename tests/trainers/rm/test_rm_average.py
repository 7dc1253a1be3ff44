"""`rlhfkit rm --ensemble K --weight-average`: OUT/average holds the members' weight average (LoRA members as one
adapter of rank K x r, full members tensor by tensor), with its own statistics, and it ranks held-out pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlhfkit.errors import UserError
from rlhfkit.models.average import weight_average
from rlhfkit.models.loading import load_reward_model, load_tokenizer
from rlhfkit.models.reward import RewardScorer
from rlhfkit.trainers import rm

from .rm_helpers import rm_config


def argv(tiny_lm, task_data, out, *extra) -> list[str]:
    return ["--model", tiny_lm, "--data", task_data["train"], "--eval-data", task_data["eval"],
            "--output-dir", str(out), "--ensemble", "2", "--weight-average", "--max-steps", "30",
            "--batch-size", "16", "--max-length", "48", "--seed", "4", *extra]  # fmt: skip


def weights(folder: Path) -> dict[str, torch.Tensor]:
    model = load_reward_model(str(folder), False, load_tokenizer(str(folder)))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_is_mean(out: Path) -> None:
    members = [weights(out), weights(out / "member-1")]
    average = weights(out / "average")
    assert set(average) == set(members[0])
    moved = 0
    for k, v in average.items():
        mean = (members[0][k] + members[1][k]) / 2
        assert torch.allclose(v, mean, atol=1e-6), k
        moved += not torch.allclose(members[0][k], members[1][k])
    assert moved > 1  # the members differ, so the average is not one of them


@pytest.mark.parametrize("lora", [True, False], ids=["lora-adapters", "full"])
def test_weight_average_is_the_members_mean(tiny_lm, task_data, tmp_path, lora):
    out = tmp_path / "rm"
    lora_args = ["--lora-r", "4", "--lora-alpha", "8", "--save-merged", "false", "--learning-rate", "2e-2"]
    extra = lora_args if lora else ["--learning-rate", "3e-3"]
    metrics = rm.train(rm_config(argv(tiny_lm, task_data, out, *extra)))
    if lora:
        config = json.loads((out / "average" / "adapter_config.json").read_text())
        assert config["r"] == 8 and config["lora_alpha"] == 8 and not (out / "average" / "model.safetensors").exists()
    assert_is_mean(out)
    stats = json.loads((out / "average" / "reward_stats.json").read_text())
    assert stats["count"] > 0 and stats["std"] > 0 and stats["max_length"] == 48
    info = json.loads((out / "ensemble.json").read_text())
    assert metrics["eval/average_accuracy"] == info["eval"]["average_accuracy"] > 0.8  # the task is easy
    scorer = RewardScorer.load(str(out / "average"), "cpu")
    assert not scorer.is_ensemble and scorer.stats["mean"] == pytest.approx(stats["mean"])


def test_weight_average_needs_an_ensemble():
    with pytest.raises(UserError, match="--ensemble"):
        rm_config(["--model", "m", "--data", "d", "--output-dir", "o", "--weight-average"])


def test_weight_average_refuses_mixed_members(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text("{}")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="one kind"):
        weight_average([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    with pytest.raises(UserError, match="at least 2"):
        weight_average([tmp_path / "a"], tmp_path / "out")
