"""Recipes: YAML configs of the set-ups people copy, shipped inside the package under ``rlhfkit/recipes/`` and
each loaded and checked by the test suite.

A recipe holds one command's options, flat, as ``--config`` reads them (``rlhfkit ppo --config FILE.yaml --model
...``); the run-specific paths (model, data, output folder) come on the command line. ``--config`` also takes a
recipe by name: its path under ``rlhfkit/recipes/`` without ``.yaml`` (``--config ppo/3b-lora-1gpu``), and
``rlhfkit.config.parse.load_recipe`` reads one.

Layout of ``rlhfkit/recipes/``:

- ``COMMAND/NAME.yaml``: one run of ``rlhfkit COMMAND``;
- ``demo/PLAN/STAGE.yaml``: the stages of one ``rlhfkit demo`` plan (the demo reads them, ``rlhfkit.demo.plan``),
  each stage run by the command ``DEMO_STAGES`` names, with ``plan.yaml`` beside them holding the demo's own
  numbers (task rows, the beta = 0 run's steps, samples per held-out prompt);
- ``accelerate/NAME.yaml``: configs of ``accelerate launch --config_file``, which a recipe's comment names.
"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.errors import UserError

RECIPES = Path(__file__).resolve().parent.parent / "recipes"  # rlhfkit/recipes, package data
# The demo's stages and the command each runs (online DPO is `rlhfkit iterate --algorithm dpo`)
DEMO_STAGES = {"sft": "sft", "rm": "rm", "ppo": "ppo", "dpo": "dpo", "iterate": "iterate", "online_dpo": "iterate"}
PLAN_FILE = "plan.yaml"
ACCELERATE = "accelerate"


def recipe_names() -> list[str]:
    """Every recipe of a command, by name (``ppo/3b-lora-1gpu``, ``demo/tiny/sft``), sorted; not the demo's
    ``plan.yaml`` files nor the accelerate configs."""
    names = []
    for path in sorted(RECIPES.rglob("*.yaml")):
        name = path.relative_to(RECIPES).with_suffix("").as_posix()
        if path.name != PLAN_FILE and not name.startswith(f"{ACCELERATE}/"):
            names.append(name)
    return names


def recipe_path(name: str) -> Path:
    """The file of recipe ``name`` (with or without ``.yaml``); a UserError naming the recipes otherwise."""
    path = RECIPES / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file() or RECIPES not in path.resolve().parents:
        raise UserError(f"{name}: no such recipe; the recipes: {', '.join(recipe_names())}")
    return path


def recipe_command(name: str) -> str:
    """The command recipe ``name`` is a config of: its folder (``ppo/...``), or for a demo stage the command that
    stage runs (``demo/tiny/online_dpo`` -> ``iterate``)."""
    parts = Path(name).with_suffix("").parts if name.endswith(".yaml") else Path(name).parts
    if parts[0] == "demo":
        return DEMO_STAGES[parts[-1]]
    return parts[0]


def config_file(path: str) -> str:
    """What ``--config PATH`` reads: the file ``path`` when it exists, else the recipe of that name when there is
    one (``ppo/3b-lora-1gpu``), else ``path`` (whose error then says it does not exist)."""
    if Path(path).is_file():
        return path
    candidate = RECIPES / (path if path.endswith(".yaml") else f"{path}.yaml")
    return str(candidate) if candidate.is_file() and RECIPES in candidate.resolve().parents else path
