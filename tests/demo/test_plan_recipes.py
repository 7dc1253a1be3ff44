"""The demo's plans are its recipes: each stage runs the options of rlhfkit/recipes/demo/PLAN/STAGE.yaml, with the
data sizes and the demo's other numbers of that folder's plan.yaml, and nothing else decides them."""

from __future__ import annotations

import importlib
import shutil

import pytest

from rlhfkit.config import recipes
from rlhfkit.config.parse import load_recipe
from rlhfkit.config.recipes import DEMO_STAGES
from rlhfkit.demo import plan


def stages(recipe: str) -> dict[str, dict]:
    return {stage: load_recipe(f"{recipe}/{stage}") for stage in DEMO_STAGES}


@pytest.mark.parametrize(
    "quick, parameters, recipe",
    [(False, 0, "demo/tiny"), (False, 135_000_000, "demo/smollm2-135m-lora"), (True, 0, "demo/quick")],
)
def test_the_demo_runs_its_recipes(quick, parameters, recipe, monkeypatch):
    monkeypatch.setattr(plan, "model_size", lambda model: (parameters, 4))
    run_plan = plan.plan(quick, "a-model" if parameters else "")
    assert run_plan.settings == stages(recipe)
    numbers = load_recipe(f"{recipe}/plan")
    assert run_plan.sizes == numbers["sizes"] and run_plan.no_kl_steps == numbers["no_kl_steps"]
    assert run_plan.eval_samples == numbers["eval_samples"]
    assert run_plan.pairs_per_round == numbers.get("pairs_per_round")


def test_a_quick_run_on_a_pretrained_model_takes_the_pretrained_plans_lora(monkeypatch):
    monkeypatch.setattr(plan, "model_size", lambda model: (135_000_000, 2))
    run_plan = plan.plan(True, "a-model")
    lora = {"lora_r": 16, "lora_alpha": 32, "save_merged": False}
    for stage, options in stages("demo/quick").items():
        extra = {"rm_lora_r": 16} if stage == "iterate" else {}
        assert run_plan.settings[stage] == {**options, **lora, **extra}, stage
    assert run_plan.sizes == load_recipe("demo/quick/plan")["pretrained_sizes"] and run_plan.parameter_bytes == 2
    assert run_plan.notes == [] and run_plan.pairs_per_round == 8


@pytest.fixture
def edited_recipes(tmp_path, monkeypatch):
    """A copy of the recipes in ``tmp_path`` that the demo reads instead (its plans loaded again from there, and
    from the package's own recipes again afterwards)."""
    shutil.copytree(recipes.RECIPES, tmp_path / "recipes")
    monkeypatch.setattr(recipes, "RECIPES", tmp_path / "recipes")
    yield tmp_path / "recipes"
    monkeypatch.undo()
    importlib.reload(plan)


def test_a_number_changed_in_a_recipe_changes_what_the_demo_runs(edited_recipes):
    ppo = edited_recipes / "demo" / "tiny" / "ppo.yaml"
    ppo.write_text(ppo.read_text().replace("kl_coef: 0.1", "kl_coef: 0.25"))
    sizes = edited_recipes / "demo" / "tiny" / "plan.yaml"
    sizes.write_text(sizes.read_text().replace("sft: 8000", "sft: 123"))
    reloaded = importlib.reload(plan)
    run_plan = reloaded.plan(False)
    assert run_plan.settings["ppo"]["kl_coef"] == 0.25 and run_plan.sizes["sft"] == 123


def test_ppo_starts_a_value_model_exactly_where_its_estimator_needs_a_critic(monkeypatch):
    from rlhfkit.commands import COMMANDS
    from rlhfkit.config.parse import build_config
    from rlhfkit.errors import UserError

    assert plan.plan(False).value_model  # the built-in model's PPO learns a value model (GAE)
    monkeypatch.setattr(plan, "model_size", lambda model: (135_000_000, 4))
    pretrained = plan.plan(False, "a-model")
    assert not pretrained.value_model  # leave-one-out advantages, in PPO and in iterated PPO alike
    assert pretrained.settings["ppo"]["advantage"] == pretrained.settings["iterate"]["advantage"] == "rloo"
    options = {"model": "sft", "reward_model": "rm", "data": "p.jsonl", "output_dir": "o", **pretrained.settings["ppo"]}

    def built(extra: dict):
        values = {k: (v, k) for k, v in {**options, **extra}.items()}
        return build_config("ppo", COMMANDS["ppo"].config, values, None)

    assert not built({}).needs_critic
    with pytest.raises(UserError, match="value_model|value-model"):  # what the demo must then leave out
        built({"value_model": "rm"})
