"""An option whose values name entries of a registry in rlhfkit.ops takes its choices from that registry, so a
name is listed once: what --help shows, what the parser accepts and what the math knows are the same names."""

from __future__ import annotations

import pytest

from rlhfkit import ops
from rlhfkit.commands import COMMANDS
from rlhfkit.config.fields import choices
from rlhfkit.config.online import ENSEMBLE_MODE_ALIASES
from rlhfkit.config.parse import leaves
from rlhfkit.ops.aggregation import LOSS_AGGREGATIONS
from rlhfkit.ops.critic_free import GRPO_SCALES
from rlhfkit.ops.kl import KL_ESTIMATORS
from rlhfkit.ops.losses import DPO_LOSS_TYPES
from tests.helpers import run_cli

REGISTRIES = {
    ("ppo", "kl_estimator"): KL_ESTIMATORS,
    ("grpo", "loss_aggregation"): LOSS_AGGREGATIONS,
    ("grpo", "scale_rewards"): GRPO_SCALES,
    ("dpo", "loss_type"): DPO_LOSS_TYPES,
    ("ppo", "ensemble_mode"): (*ops.ENSEMBLE_OBJECTIVES, *ENSEMBLE_MODE_ALIASES),
    ("ppo", "advantage"): tuple(ops.ADVANTAGE_ESTIMATORS),
    ("ppo", "importance_ratio"): tuple(ops.POLICY_LOSSES),
}


def _option_type(command: str, name: str):
    return next(leaf.type for leaf in leaves(COMMANDS[command].config()) if leaf.name == name)


@pytest.mark.parametrize(("command", "name"), list(REGISTRIES))
def test_the_choices_are_the_registry_s_names(command, name):
    assert choices(_option_type(command, name)) == REGISTRIES[command, name]


def test_a_policy_loss_registered_later_is_at_once_a_choice(monkeypatch):
    monkeypatch.setitem(ops.POLICY_LOSSES, "my-ratio", ops.POLICY_LOSSES["token"])
    assert "my-ratio" in choices(_option_type("grpo", "importance_ratio"))


def test_a_name_outside_the_registry_is_refused_naming_the_choices(capsys):
    code, _, err = run_cli(capsys, "ppo", "--kl-estimator", "k4", "--model", "m", "--data", "d", "--output-dir", "o")
    assert code != 0 and "k4" in err and all(name in err for name in KL_ESTIMATORS)
