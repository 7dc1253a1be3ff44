"""Experiment trackers (``--report-to``) through accelerate's: TensorBoard, Weights & Biases, Trackio, MLflow.

``metrics.jsonl`` is written whatever is chosen (``logger.py``); the trackers get the same values at the same
steps, and the run's options, flattened, as its hyperparameters. Only the main process starts them and logs.

    names = tracker_names(run.report_to)                  # ["wandb", "tensorboard"]; "all": those installed
    accelerator = Accelerator(log_with=build(names, run))
    start(accelerator, run, config)                       # main process: a run per tracker, the options logged
    accelerator.log({"loss": 0.5}, step=1)
    finish(accelerator)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlhfkit.config.trackers import CHOICES, TRACKERS, Tracker, check, given_names, installed  # noqa: F401
from rlhfkit.errors import UserError, option

DEFAULT_PROJECT = "rlhfkit"


def tracker_names(report_to: list[str]) -> list[str]:
    """The trackers to start: ``none`` or nothing -> none, ``all`` -> every one whose package is installed."""
    names = given_names(report_to)
    if "all" in names:
        return [name for name in TRACKERS if installed(name)]
    return [name for name in names if name in TRACKERS]


def project_name(name: str, project: str) -> str:
    """--project, else the tracker's own environment variable (WANDB_PROJECT, MLFLOW_EXPERIMENT_NAME), else
    ``rlhfkit``."""
    env = TRACKERS[name].project_env
    return project or (os.environ.get(env, "") if env else "") or DEFAULT_PROJECT


def run_name(run) -> str:
    """--run-name, else the name of the --output-dir folder."""
    return run.run_name or Path(run.output_dir).resolve().name


def build(names: list[str], run) -> list:
    """accelerate's tracker objects for ``names`` (a RunArgs ``run`` names the project, the run and the output
    folder); nothing is started yet. TensorBoard writes to ``OUTPUT_DIR/tensorboard``."""
    from accelerate.tracking import MLflowTracker, TensorBoardTracker, TrackioTracker, WandBTracker

    trackers = []
    for name in names:
        project = project_name(name, run.project)
        if name == "tensorboard":
            trackers.append(TensorBoardTracker("tensorboard", run.output_dir))
        elif name == "wandb":
            trackers.append(WandBTracker(project, name=run_name(run)))
        elif name == "trackio":
            trackers.append(TrackioTracker(project, name=run_name(run)))
        elif name == "mlflow":
            tracker = MLflowTracker(experiment_name=project, run_name=run_name(run))
            tracker.experiment_name = project  # accelerate lets MLFLOW_EXPERIMENT_NAME win over --project
            trackers.append(tracker)
    return trackers


def hyperparameters(options: dict[str, Any]) -> dict[str, Any]:
    """The run's options as every tracker takes them: numbers, strings and booleans as they are, lists
    comma-joined, unset values as ``"none"``."""

    def scalar(value):
        if isinstance(value, (list, tuple)):
            return ",".join(map(str, value))
        if value is None:
            return "none"
        return value if isinstance(value, (bool, int, float, str)) else str(value)

    return {name: scalar(value) for name, value in options.items()}


def start(accelerator, run, options: dict[str, Any]) -> None:
    """Start a run in every tracker of ``accelerator`` with the options (``run_name`` as resolved) as its
    hyperparameters; main process only, the others do nothing."""
    if not accelerator.log_with or not accelerator.is_main_process:
        return
    config = hyperparameters({**options, "run_name": run_name(run)})
    try:
        accelerator.init_trackers(DEFAULT_PROJECT, config=config)
    except Exception as exc:  # a tracker's own message: not logged in, no server, ...
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"{option('report_to')}: a tracker could not start: {message}") from exc


def log(accelerator, step: int, metrics: dict[str, float | None]) -> None:
    """The step's metrics to every tracker; values that are not finite numbers (None) are left out."""
    values = {key: value for key, value in metrics.items() if value is not None}
    if accelerator.trackers and values:
        accelerator.log(values, step=step)


def text(accelerator, tag: str, body: str, step: int) -> None:
    """Markdown text (the sample generations) to TensorBoard's text tab, when TensorBoard is among the trackers."""
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            tracker.writer.add_text(tag, body, step)


def finish(accelerator) -> None:
    """Close every tracker's run (written out, uploaded where online). Unlike ``end_training`` this leaves
    the process group up: a command may run more trainings after this one in the same processes (an
    ensemble's members, the demo's stages, a script calling the Python API)."""
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers.clear()
