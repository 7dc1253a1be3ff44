"""--carry-optimizer: each round's PPO (or online DPO) goes on with the last round's AdamW moments, on one
learning-rate schedule over every round's steps."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.config.iterate import IterateConfig
from rlhfkit.errors import UserError
from rlhfkit.iterated.online_dpo import OnlineDPO
from rlhfkit.iterated.runs import OPTIMIZER_FILE

from ..helpers import metrics
from .conftest import SMALL


def test_ppo_rounds_continue_one_optimizer_and_schedule(iterate_task, tmp_path):
    t, out = iterate_task, tmp_path / "out"
    small = {**SMALL, "max_steps": 4, "pairs_per_round": 16, "rm_steps": 5, "rm_initial_steps": 10}
    rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out), judge=t["judge"], rounds=2,
        carry_optimizer=True, **small,
    )  # fmt: skip
    first, second = (metrics(out / f"round-{k}" / "ppo") for k in (1, 2))
    peak = SMALL["learning_rate"]
    # one linear decay over 2 x 4 steps: round 1 starts at the peak, round 2 halfway down, not at the peak again
    assert first[0]["learning_rate"] == pytest.approx(peak)
    assert second[0]["learning_rate"] == pytest.approx(peak / 2)
    assert second[-1]["learning_rate"] < first[-1]["learning_rate"] < peak
    # the last round's state is kept (a run continued later reads it); the one it replaced is gone
    assert (out / "round-2" / "ppo" / OPTIMIZER_FILE).is_file()
    assert not (out / "round-1" / "ppo" / OPTIMIZER_FILE).exists()


def test_online_dpo_rounds_carry_it_too_and_the_loop_owns_the_options(iterate_task, tmp_path):
    t = iterate_task
    cfg = IterateConfig()
    cfg.model.model, cfg.iterate.rounds, cfg.iterate.carry_optimizer = t["sft"], 3, True
    dpo = OnlineDPO(cfg, tmp_path, "cpu")
    state = tmp_path / "round-1" / "dpo" / OPTIMIZER_FILE
    state.parent.mkdir(parents=True)
    state.write_bytes(b"")  # (only its path matters here)
    run = dpo.config(t["sft"], Path(t["prefs"]), 32, tmp_path / "round-2" / "dpo", 2, state, position=8)
    steps = run.optim.max_steps  # 2 epochs over 32 pairs in batches of 8
    assert (steps, run.optim.optimizer_state, run.optim.schedule_steps) == (8, str(state), 8 + 2 * 8)
    assert run.run.save_steps == steps  # the round's last step is checkpointed, so its state can be kept
    cfg.iterate.carry_optimizer = False
    plain = dpo.config(t["sft"], Path(t["prefs"]), 32, tmp_path / "round-2" / "dpo", 2, state, position=8)
    assert (plain.optim.optimizer_state, plain.optim.schedule_steps) == ("", 0)

    out = tmp_path / "online"
    rlhfkit.iterate(
        model=t["sft"], data=t["prompts"], output_dir=str(out), judge=t["judge"], algorithm="dpo", rounds=2,
        pairs_per_round=16, dpo_epochs=1.0, learning_rate=3e-4, batch_size=16, max_new_tokens=8, progress=False,
        carry_optimizer=True,
    )  # fmt: skip
    first, second = (metrics(out / f"round-{k}" / "dpo") for k in (1, 2))
    assert first[0]["learning_rate"] == pytest.approx(3e-4) and second[0]["learning_rate"] < first[-1]["learning_rate"]
    assert (out / "round-2" / "dpo" / OPTIMIZER_FILE).is_file() and not (
        out / "round-1" / "dpo" / OPTIMIZER_FILE
    ).exists()
    assert not (out / "round-1" / "dpo" / "checkpoints").exists()  # the round's state kept, its checkpoint dropped

    with pytest.raises(UserError, match="carry_optimizer=True"):
        rlhfkit.iterate(
            model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(tmp_path / "x"), judge=t["judge"],
            optimizer_state=str(state),
        )  # fmt: skip
