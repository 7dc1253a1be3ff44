"""The step's timings (``reporting.timed``): each phase of the step under its metric name, the phases nested in
the rollout's time and the rollout and the update in the step's."""

from __future__ import annotations

import pytest

from rlhfkit.trainers.online import train
from rlhfkit.trainers.online.reporting import timed

from .conftest import ThanksScorer, parse, read_metrics

PHASES = ("time/generate_s", "time/score_s", "time/forward_s")


def test_timed_records_a_block_that_returns_and_not_one_that_raises():
    metrics: dict = {}

    def returns_inside() -> int:
        with timed(metrics, "time/a_s"):
            return 1

    assert returns_inside() == 1 and metrics["time/a_s"] >= 0
    with pytest.raises(ValueError), timed(metrics, "time/b_s"):
        raise ValueError
    assert "time/b_s" not in metrics


def test_each_step_logs_its_phases_within_the_rollout_and_the_step(thanks_task, tmp_path):
    model, prompts = thanks_task
    flags = "--reward-model none --batch-size 8 --max-new-tokens 6 --progress false --max-steps 2"
    train(parse("ppo", f"--model {model} --data {prompts} --output-dir {tmp_path} {flags}"), scorer=ThanksScorer())
    for row in read_metrics(tmp_path):
        assert all(row[name] > 0 for name in (*PHASES, "time/rollout_s", "time/update_s", "time/step_s")), row
        assert sum(row[name] for name in PHASES) <= row["time/rollout_s"]
        assert row["time/rollout_s"] + row["time/update_s"] <= row["time/step_s"]
