"""Every recipe shipped in rlhfkit/recipes loads into its command's config and passes the command's checks, with
the run's own paths on the command line as a user gives them; `--config` takes a recipe by name; the demo's plans
are checked; the accelerate config of the FSDP2 recipe is one accelerate reads, the same as the example's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from rlhfkit.cli.main import COMMANDS
from rlhfkit.config.parse import flat_dict, load_recipe, parse_config
from rlhfkit.config.recipes import DEMO_STAGES, PLAN_FILE, RECIPES, recipe_command, recipe_names, recipe_path
from rlhfkit.demo import plan
from rlhfkit.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
NAMES = recipe_names()


@pytest.fixture(scope="module")
def paths(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    """The paths a run gives on the command line: the tiny model, and small data files."""
    d = tmp_path_factory.mktemp("recipe_paths")
    (d / "prompts.jsonl").write_text(json.dumps({"prompt": "User: hello\nAssistant:"}) + "\n")
    (d / "prefs.jsonl").write_text(json.dumps({"prompt": "hi", "chosen": " hello", "rejected": " no"}) + "\n")
    (d / "guidelines.md").write_text("Prefer the kinder reply.\n")
    return {"model": str(tiny_model_dir), "dir": str(d)}


def command_line(command: str, options: dict, paths: dict) -> list[str]:
    """The flags a user adds to a recipe of ``command``: model, data and output folder, and what the command needs
    besides that a recipe leaves to the run (a reward model, a reward function, a judge, first pairs)."""
    d, model = paths["dir"], paths["model"]
    data = f"{d}/prefs.jsonl" if command in ("rm", "dpo") else f"{d}/prompts.jsonl"
    argv = ["--model", model, "--data", data, "--output-dir", f"{d}/out"]
    if command == "ppo":
        argv += ["--reward-model", model]
    if command == "grpo":
        argv += ["--reward-fn", "arithmetic"]
    if command == "iterate":
        argv += ["--prefs", f"{d}/prefs.jsonl", *([] if "judge" in options else ["--judge", "support"])]
    return argv


@pytest.mark.parametrize("name", NAMES)
def test_each_recipe_loads_into_its_commands_config_and_passes_its_checks(name, paths):
    command = recipe_command(name)
    options = load_recipe(name)
    assert options, f"{name}: empty"
    config_cls = COMMANDS[command].config
    # as a user runs it: the recipe by name, the run's paths as flags
    config, _ = parse_config(
        f"rlhfkit {command}", config_cls, ["--config", name, *command_line(command, options, paths)]
    )
    resolved = flat_dict(config)
    for key, value in options.items():
        # every value reaches the config as written (a YAML 1e-5, without its dot, would be the text "1e-5")
        got = resolved[key]
        assert got == value and (isinstance(got, float) or type(got) is type(value)), (name, key, got, value)
    # the file given by its path reads the same
    by_path, _ = parse_config(
        f"rlhfkit {command}", config_cls, ["--config", str(recipe_path(name)), *command_line(command, options, paths)]
    )
    assert flat_dict(by_path) == resolved


@pytest.mark.parametrize("name", NAMES)
def test_each_recipe_says_how_to_run_it(name):
    """The comment at the top of a recipe shows its command line, with its own command and name; a GPU recipe's
    accelerate config is a file that exists."""
    lines = [line.lstrip("#").strip() for line in recipe_path(name).read_text().splitlines() if line.startswith("#")]
    comment = " ".join(" ".join(lines).replace("\\", " ").split())  # continued command lines joined
    assert comment, f"{name}: no comment saying what it is for"
    if name.startswith("demo/quick/"):
        return  # the demo's wiring check, run by `rlhfkit demo --quick`
    assert f"rlhfkit {recipe_command(name)} --config {name} " in comment, name
    for accelerate in re.findall(r"--config_file (\S+)", comment):
        assert (ROOT / accelerate).is_file(), f"{name}: {accelerate} does not exist"


def test_the_recipes_are_laid_out_by_command():
    assert {n.split("/")[0] for n in NAMES} <= {*COMMANDS, "demo"}
    for folder in (RECIPES / "demo").iterdir():
        stages = {p.stem for p in folder.glob("*.yaml")}
        assert stages == {*DEMO_STAGES, Path(PLAN_FILE).stem}, folder.name
        plan.plan_numbers(f"demo/{folder.name}")  # its plan.yaml is checked
    for name in ("ppo/3b-lora-1gpu", "ppo/7b-fsdp2-8gpu", "grpo/vllm-1gpu", "iterate/human-labels"):
        assert name in NAMES


def test_a_config_names_a_file_or_a_recipe(tmp_path, monkeypatch):
    config_cls = COMMANDS["grpo"].config
    argv = ["--model", "m", "--data", "d.jsonl", "--output-dir", "o", "--reward-fn", "arithmetic"]
    with pytest.raises(UserError, match="grpo/none: config file does not exist"):
        parse_config("rlhfkit grpo", config_cls, ["--config", "grpo/none", *argv])
    # a file of that name, where there is one, comes before the recipe
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "vllm-1gpu.yaml").write_text("num_generations: 4\n")
    config, _ = parse_config("rlhfkit grpo", config_cls, ["--config", "grpo/vllm-1gpu.yaml", *argv])
    assert config.advantage.num_generations == 4 and not config.vllm.use_vllm
    config, _ = parse_config("rlhfkit grpo", config_cls, ["--config", "grpo/vllm-1gpu", *argv])
    assert config.vllm.use_vllm and config.advantage.num_generations == 8  # no such file here: the recipe


def test_a_demo_plan_file_is_checked(tmp_path, monkeypatch):
    from rlhfkit.config import recipes

    folder = tmp_path / "demo" / "tiny"
    folder.mkdir(parents=True)
    monkeypatch.setattr(recipes, "RECIPES", tmp_path)
    (folder / PLAN_FILE).write_text("sizes: {sft: 10}\nno_kl_steps: 2\neval_samples: 1\nseeds: 3\n")
    with pytest.raises(UserError, match="unknown key 'seeds'"):
        plan.plan_numbers("demo/tiny")
    (folder / PLAN_FILE).write_text("sizes: {sft: 10}\nno_kl_steps: two\neval_samples: 1\n")
    with pytest.raises(UserError, match="'no_kl_steps' must be an integer"):
        plan.plan_numbers("demo/tiny")
    (folder / PLAN_FILE).write_text("sizes: {sft: 10}\nno_kl_steps: 2\n")
    with pytest.raises(UserError, match="missing eval_samples"):
        plan.plan_numbers("demo/tiny")


def test_the_fsdp2_recipes_accelerate_config_is_accelerates_and_the_examples():
    from accelerate.commands.config.config_args import load_config_from_file

    recipe = RECIPES / "accelerate" / "fsdp2-8gpu.yaml"
    config = load_config_from_file(str(recipe))  # accelerate's own reader refuses keys it does not know
    assert config.distributed_type == "FSDP" and config.num_processes == 8 and config.fsdp_config["fsdp_version"] == 2
    example = ROOT / "examples" / "accelerate" / "fsdp2.yaml"
    assert yaml.safe_load(recipe.read_text()) == yaml.safe_load(example.read_text())
