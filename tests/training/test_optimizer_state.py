"""--optimizer-state and --schedule-steps: a run continued from an earlier one's optimizer and schedule ends where
one uninterrupted run ends; a state that does not fit the model is refused."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.errors import UserError
from rlhfkit.training import updates
from rlhfkit.training.checkpoint import STATE_FILE

from ..helpers import max_weight_diff, metrics, run_cli, sft_args, sft_rows, weights, write_jsonl

FLAGS = dict(batch_size=8, learning_rate=3e-3, warmup_steps=2, weight_decay=0.1)  # every row in every step


def test_two_runs_carrying_the_optimizer_end_where_one_run_ends(tiny_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(8, seed=5))
    whole, first, second = tmp_path / "whole", tmp_path / "first", tmp_path / "second"
    assert run_cli(capsys, *sft_args(tiny_model_dir, data, whole, max_steps=6, **FLAGS))[0] == 0
    assert (
        run_cli(capsys, *sft_args(tiny_model_dir, data, first, max_steps=3, schedule_steps=6, save_steps=3, **FLAGS))[0]
        == 0
    )
    code, _, err = run_cli(
        capsys, *sft_args(first, data, second, max_steps=3, schedule_steps=6, optimizer_state=first, **FLAGS)
    )
    assert code == 0, err
    assert max_weight_diff(weights(whole), weights(second)) < 1e-5
    rates = [r["learning_rate"] for r in metrics(whole)]
    assert [r["learning_rate"] for r in metrics(second)] == pytest.approx(rates[3:], rel=1e-6)

    # without the carried moments the second half lands elsewhere (AdamW's first steps are sign-sized)
    fresh = tmp_path / "fresh"
    assert run_cli(capsys, *sft_args(first, data, fresh, max_steps=3, schedule_steps=6, **FLAGS))[0] == 0
    assert max_weight_diff(weights(whole), weights(fresh)) > 1e3 * max_weight_diff(weights(whole), weights(second))


def _state(model: torch.nn.Module, path, steps: int = 2, total: int = 4):
    class Optim:
        learning_rate, weight_decay, warmup_steps, lr_scheduler = 1e-2, 0.0, 0, "linear"

    optimizer = updates.build_optimizer(model, Optim)
    scheduler = updates.build_scheduler(optimizer, Optim, total)
    for _ in range(steps):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, path / STATE_FILE)
    return optimizer, scheduler, Optim


def test_the_carried_state_keeps_this_runs_rate_and_refuses_other_parameters(tmp_path):
    from accelerate import Accelerator

    torch.manual_seed(0)
    saved, _, optim = _state(torch.nn.Linear(3, 2), tmp_path)
    optim.learning_rate = 4e-2  # this run's own rate: the schedule's position carries, its peak is this run's
    model = torch.nn.Linear(3, 2)
    optimizer = updates.build_optimizer(model, optim)
    scheduler = updates.build_scheduler(optimizer, optim, 4)
    assert updates.carry_in(Accelerator(cpu=True), optimizer, scheduler, tmp_path) == 2
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([4e-2 * 0.5] * 2)
    assert scheduler.get_last_lr() == pytest.approx([2e-2] * 2)
    moments = [optimizer.state[p]["exp_avg"] for g in optimizer.param_groups for p in g["params"]]
    expected = [saved.state[p]["exp_avg"] for g in saved.param_groups for p in g["params"]]
    assert all(torch.equal(a, b) for a, b in zip(moments, expected))

    other = torch.nn.Linear(3, 4)  # the same tensors in number, of other shapes
    optimizer = updates.build_optimizer(other, optim)
    with pytest.raises(UserError, match="other parameters"):
        updates.carry_in(Accelerator(cpu=True), optimizer, updates.build_scheduler(optimizer, optim, 4), tmp_path)
    with pytest.raises(UserError, match="no trainer_state.pt"):
        updates.state_file(tmp_path / "nowhere")


def test_a_schedule_shorter_than_the_run_is_refused(tiny_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(8, seed=5))
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, tmp_path / "o", max_steps=6, schedule_steps=4))
    assert code != 0 and "--schedule-steps 4 is shorter than the run's --max-steps 6" in err
