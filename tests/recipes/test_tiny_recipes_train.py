"""The CPU-sized recipes, the stages of the demo on its built-in model (demo/tiny), run on the tiny model as a user
runs them (`rlhfkit COMMAND --config demo/tiny/STAGE ...`), a few steps each, and train: SFT's loss falls, the reward
model and DPO learn a preference, PPO's policy moves from its reference, and both loops finish their round."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from rlhfkit.cli.main import main
from rlhfkit.config.parse import load_recipe

from ..conftest import ITEMS, NAMES

COMMON = ["--progress", "false"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Replies the tiny model's tokenizer knows: SFT demonstrations, pairs whose chosen reply helps and rejected one
    refuses, the prompts, and a judge that prefers the longer reply."""
    d = tmp_path_factory.mktemp("tiny_recipes")
    refusals = [" no.", " sorry, no.", " goodbye."]
    sft, prefs, prompts = [], [], []
    for i, (name, item) in enumerate((n, it) for n in NAMES for it in ITEMS):
        prompt = f"User: please give {name} the {item}\nAssistant:"
        reply = f" Sure, here is the {item} for {name}."
        sft.append({"prompt": prompt, "completion": reply})
        prefs.append({"prompt": prompt, "chosen": reply, "rejected": refusals[i % len(refusals)]})
        prompts.append({"prompt": prompt})
    for name, rows in (("sft", sft), ("prefs", prefs), ("prompts", prompts)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = "def prefer(prompts, completions, **kwargs):\n    return [int(len(a) < len(b)) for a, b in completions]\n"
    (d / "judge.py").write_text(judge)
    return d


def run(command: str, stage: str, *flags) -> None:
    assert main([command, "--config", f"demo/tiny/{stage}", *map(str, flags), *COMMON]) == 0


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def ran_with_recipe(out: Path, stage: str, overridden: set[str]) -> None:
    """The run's resolved options (its config.yaml) hold every option of the recipe it was not told otherwise."""
    config = yaml.safe_load((out / "config.yaml").read_text())
    for key, value in load_recipe(f"demo/tiny/{stage}").items():
        if key not in overridden:
            assert config[key] == value, (stage, key, config[key], value)


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def test_the_tiny_demo_recipes_train_the_tiny_model(tiny_model_dir, data, tmp_path):
    out = tmp_path
    # SFT from the random tiny model: 30 of the recipe's steps (its warm-up, rate and cosine decay) cut the loss
    run("sft", "sft", "--model", tiny_model_dir, "--data", data / "sft.jsonl", "--output-dir", out / "sft",
        "--max-steps", 30, "--eval-steps", 0)  # fmt: skip
    rows = metrics(out / "sft")
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
    ran_with_recipe(out / "sft", "sft", {"max_steps", "eval_steps"})

    # the reward model ranks the helpful reply over the refusal after 30 steps
    run("rm", "rm", "--model", out / "sft", "--data", data / "prefs.jsonl", "--output-dir", out / "rm",
        "--max-steps", 30, "--eval-steps", 0)  # fmt: skip
    rows = metrics(out / "rm")
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=0.02)
    assert mean(rows[-5:], "accuracy") > 0.8 and mean(rows[-5:], "loss") < 0.6, rows[-5:]
    ran_with_recipe(out / "rm", "rm", {"max_steps", "eval_steps"})

    # PPO against it, the value model started from it: the policy samples step 1 as its reference, then moves away
    run("ppo", "ppo", "--model", out / "sft", "--reward-model", out / "rm", "--value-model", out / "rm",
        "--data", data / "prompts.jsonl", "--output-dir", out / "ppo", "--max-steps", 3)  # fmt: skip
    rows = metrics(out / "ppo")
    assert rows[0]["kl/ref"] == 0.0 and rows[-1]["kl/ref"] > 0.01 and rows[0]["kl/coef"] == 0.1
    assert all(math.isfinite(r["loss/total"]) for r in rows)
    ran_with_recipe(out / "ppo", "ppo", {"max_steps"})

    # DPO (beta 3, reference log-probs precomputed): from log 2 at step 1 to a loss below it
    run("dpo", "dpo", "--model", out / "sft", "--data", data / "prefs.jsonl", "--output-dir", out / "dpo",
        "--max-steps", 20, "--eval-steps", 0)  # fmt: skip
    rows = metrics(out / "dpo")
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert mean(rows[-5:], "loss") < 0.5 and mean(rows[-5:], "rewards/accuracy") > 0.8, rows[-5:]
    ran_with_recipe(out / "dpo", "dpo", {"max_steps", "eval_steps"})

    # iterated PPO and online DPO: one round each, labelled by the judge
    loop = ["--model", out / "sft", "--prefs", data / "prefs.jsonl", "--data", data / "prompts.jsonl",
            "--judge", f"{data / 'judge.py'}:prefer", "--rounds", 1, "--pairs-per-round", 8]  # fmt: skip
    run("iterate", "iterate", *loop, "--output-dir", out / "iterated", "--max-steps", 2, "--rm-initial-steps", 4,
        "--rm-steps", 2)  # fmt: skip
    summary = json.loads((out / "iterated" / "summary.json").read_text())
    assert [r["ppo_steps"] for r in summary["rounds"]] == [2] and summary["rounds"][0]["kl_coef"] == 0.1
    assert (out / "iterated" / "final" / "config.json").is_file()
    ran_with_recipe(out / "iterated", "iterate", {"rounds", "max_steps", "rm_initial_steps", "rm_steps"})
    run("iterate", "online_dpo", *loop, "--output-dir", out / "online_dpo", "--dpo-epochs", 0.1)
    assert (out / "online_dpo" / "round-1" / "dpo").is_dir()
    assert (out / "online_dpo" / "final" / "config.json").is_file()
    ran_with_recipe(out / "online_dpo", "online_dpo", {"rounds", "dpo_epochs"})
