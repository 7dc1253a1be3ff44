"""The experiment trackers ``--report-to`` names (TensorBoard, Weights & Biases, Trackio, MLflow) and the check of
the option: the names, what each imports and what to install. ``rlhfkit.training.trackers`` starts them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from rlhfkit.errors import UserError, option


@dataclass(frozen=True)
class Tracker:
    module: str  # what is imported
    package: str  # what to install: pip install PACKAGE
    project_env: str = ""  # the tracker's own environment variable for the project, read when --project is unset


TRACKERS = {
    "tensorboard": Tracker("tensorboard", "tensorboard"),
    "wandb": Tracker("wandb", "wandb", "WANDB_PROJECT"),
    "trackio": Tracker("trackio", "trackio"),
    "mlflow": Tracker("mlflow", "mlflow", "MLFLOW_EXPERIMENT_NAME"),
}
CHOICES = (*TRACKERS, "all", "none")


def installed(name: str) -> bool:
    return importlib.util.find_spec(TRACKERS[name].module) is not None


def given_names(report_to: list[str]) -> list[str]:
    """The names as given, split at commas, without repeats (``["wandb,tensorboard"]`` -> two names)."""
    names = [part.strip().lower() for item in report_to for part in str(item).split(",") if part.strip()]
    return list(dict.fromkeys(names))


def check(report_to: list[str]) -> list[str]:
    """``report_to`` as given (comma-separated items split); raises a UserError naming an unknown tracker,
    ``none`` or ``all`` beside others, or a tracker whose package is not installed (before any model loads)."""
    names = given_names(report_to)
    for name in names:
        if name not in CHOICES:
            raise UserError(f"{option('report_to')} must be among {', '.join(CHOICES)}, got {name!r}")
    for alone in ("none", "all"):
        if alone in names and len(names) > 1:
            raise UserError(f"{option('report_to', alone)} cannot be given with other trackers, got {names}")
    for name in names:
        if name in TRACKERS and not installed(name):
            package = TRACKERS[name].package
            raise UserError(
                f"{option('report_to', name)} needs the {package} package: pip install {package} "
                f"(or pip install 'rlhfkit[{package}]')"
            )
    return names
