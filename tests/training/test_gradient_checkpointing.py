"""--gradient-checkpointing recomputes the layers' activations in the backward pass and changes nothing else:
each trainer logs the same losses and ends at the same weights with it as without it."""

from __future__ import annotations

import pytest
from transformers.models.gpt2 import modeling_gpt2

from rlhfkit.cli.main import main

from ..helpers import max_weight_diff, metrics, pref_rows, sft_rows, weights, write_jsonl


@pytest.fixture
def block_calls(monkeypatch):
    """Counts the forwards of GPT-2's MLPs (inside a checkpointed block, they run again during the backward pass)."""
    calls = []
    forward = modeling_gpt2.GPT2MLP.forward

    def counted(self, *args, **kwargs):
        calls.append(self.training)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(modeling_gpt2.GPT2MLP, "forward", counted)
    return calls


def run(command: str, model, data, out, *flags) -> tuple[list[dict], dict]:
    args = [command, "--model", model, "--data", data, "--output-dir", out, "--max-steps", 3, "--batch-size", 4]
    args += ["--learning-rate", 1e-3, "--progress", "false", "--pack-sequences", "false", *flags]
    assert main([str(a) for a in args]) == 0
    return metrics(out), weights(out)


@pytest.mark.parametrize("command", ["sft", "rm", "dpo"])
def test_same_losses_and_weights_with_fewer_activations_kept(command, tiny_model_dir, tmp_path, block_calls):
    rows = sft_rows(16, seed=3) if command == "sft" else pref_rows(16, seed=3)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    plain, w_plain = run(command, tiny_model_dir, data, tmp_path / "plain")
    forwards = sum(block_calls)
    block_calls.clear()
    checkpointed, w_checkpointed = run(command, tiny_model_dir, data, tmp_path / "gc", "--gradient-checkpointing")
    assert sum(block_calls) > forwards  # the training passes' layers ran again in the backward passes
    for a, b in zip(plain, checkpointed):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert max_weight_diff(w_plain, w_checkpointed) < 1e-6
    assert len({round(r["loss"], 6) for r in plain}) > 1 and all(r["grad_norm"] > 0 for r in plain)  # it trained
