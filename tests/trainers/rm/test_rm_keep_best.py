"""`--keep-best` and `--patience` on `rlhfkit rm` (the shared offline loop): the final model is the one of the
lowest held-out loss, and training stops once the held-out loss has not fallen for --patience evaluations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlhfkit.config.parts import StoppingArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError
from rlhfkit.models.loading import load_reward_model, load_tokenizer
from rlhfkit.trainers import rm
from rlhfkit.training.loop import BestWeights

from .rm_helpers import rm_config


def argv(tiny_lm, task_data, out, *extra) -> list[str]:
    return ["--model", tiny_lm, "--data", task_data["train"], "--eval-data", task_data["eval"],
            "--output-dir", str(out), "--batch-size", "16", "--max-length", "48", "--seed", "3", *extra]  # fmt: skip


def logged(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def held_out_loss(out: Path, eval_path: str) -> float:
    tokenizer = load_tokenizer(str(out))
    model = load_reward_model(str(out), False, tokenizer)
    cfg = rm_config(["--model", str(out), "--data", eval_path, "--output-dir", "unused", "--max-length", "48"])
    pairs = rm.encode_all(tokenizer, load_examples(eval_path, "preference", "test"), cfg.data)
    return rm.evaluate(model, pairs, tokenizer.pad_token_id, 32, "cpu")["eval/loss"]


def test_best_weights_tracks_the_lowest_loss_and_counts_patience():
    layer = torch.nn.Linear(2, 1)
    best = BestWeights(StoppingArgs())
    assert not best.keep and not best.update(1, 1.0, layer)  # both off: never stops, keeps nothing
    best = BestWeights(StoppingArgs(keep_best=True, patience=2))
    with torch.no_grad():
        layer.weight.fill_(1.0)
    assert not best.update(1, 0.5, layer)
    with torch.no_grad():
        layer.weight.fill_(2.0)
    assert not best.update(2, 0.6, layer)  # worse once
    assert not best.update(3, 0.4, layer)  # better: the count starts again, weights 2.0 kept
    with torch.no_grad():
        layer.weight.fill_(3.0)
    assert not best.update(4, 0.4, layer)  # equal is not lower
    assert best.update(5, 0.7, layer)  # two in a row: stop
    best.restore(layer, "test")
    assert best.best_step == 3 and torch.equal(layer.weight, torch.full_like(layer.weight, 2.0))


def test_keep_best_saves_the_lowest_held_out_loss(tiny_lm, task_data, tmp_path):
    out = tmp_path / "rm"
    # A learning rate high enough that the held-out loss does not fall at every evaluation.
    rm.train(rm_config(argv(tiny_lm, task_data, out, "--max-steps", "12", "--eval-steps", "1",
                            "--learning-rate", "3e-2", "--keep-best")))  # fmt: skip
    losses = {m["step"]: m["eval/loss"] for m in logged(out) if "eval/loss" in m}
    assert sorted(losses) == list(range(1, 13))
    best = min(losses, key=losses.get)
    assert best != 12, f"the test needs a run whose last evaluation is not its best: {losses}"
    assert held_out_loss(out, task_data["eval"]) == pytest.approx(losses[best], abs=1e-4)
    assert held_out_loss(out, task_data["eval"]) < losses[12] - 1e-3


def test_patience_stops_training(tiny_lm, task_data, tmp_path):
    out = tmp_path / "rm"
    # A learning rate too small to move fp32 weights: no evaluation after the first lowers the loss.
    rm.train(rm_config(argv(tiny_lm, task_data, out, "--max-steps", "20", "--eval-steps", "2",
                            "--learning-rate", "1e-15", "--patience", "2")))  # fmt: skip
    steps = [m["step"] for m in logged(out)]
    assert steps[-1] == 6  # evaluations at 2 (the best), 4 and 6 (not lower twice): stop
    assert (out / "reward_stats.json").is_file()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--keep-best"], "--eval-steps"),
        (["--patience", "2"], "--eval-steps"),
        (["--patience", "-1"], "--patience"),
    ],
)
def test_stopping_needs_periodic_evaluation(extra, message):
    with pytest.raises(UserError, match=message):
        rm_config(["--model", "m", "--data", "d", "--eval-data", "e", "--output-dir", "o", *extra])


def test_stopping_needs_eval_data():
    with pytest.raises(UserError, match="--eval-data"):
        rm_config(["--model", "m", "--data", "d", "--output-dir", "o", "--eval-steps", "5", "--keep-best"])
