"""Errors name options as the caller wrote them: ``--max-steps`` on the command line, ``max_steps`` in Python.

Each case gives the same bad input to the command line and to the Python API and compares the two whole
messages; then a causal LM given where a reward model belongs, through both.
"""

from __future__ import annotations

import pytest

import rlhfkit

from ..helpers import run_cli, write_jsonl

# (command, options as keywords, the command line's message, the Python API's message)
CASES = [
    (
        "sft",
        {"model": "m", "data": "d.jsonl"},
        "rlhfkit sft: --output-dir is required",
        "rlhfkit.sft: output_dir is required",
    ),
    (
        "sft",
        {"model": "m", "data": "d.jsonl", "output_dir": "OUT", "learning_rate": -1.0},
        "--learning-rate must be > 0, got -1.0",
        "learning_rate must be > 0, got -1.0",
    ),
    (
        "sft",
        {"model": "m", "data": "d.jsonl", "output_dir": "OUT", "max_steps": 0},
        "--max-steps must be > 0 or -1, got 0",
        "max_steps must be > 0 or -1, got 0",
    ),
    (
        "ppo",
        {"model": "m", "data": "d.jsonl", "output_dir": "OUT"},
        "rlhfkit ppo: give --reward-model or at least one --reward-fn",
        "rlhfkit.ppo: give reward_model or at least one reward function (reward_fns)",
    ),
    (
        "grpo",
        {"model": "m", "data": "d.jsonl", "output_dir": "OUT", "reward_model": "r", "batch_size": 10},
        "--batch-size 10 must be a multiple of --num-generations 8: it counts completions, 8 per prompt",
        "batch_size=10 must be a multiple of num_generations=8: it counts completions, 8 per prompt",
    ),
    (
        "grpo",
        {"model": "m", "data": "d.jsonl", "output_dir": "OUT", "reward_model": "r", "advantage": "gae"},
        "--advantage gae needs a value function: use rlhfkit ppo, or one of grpo, rloo, reinforce_pp, "
        "reinforce_pp_baseline",
        "advantage='gae' needs a value function: use rlhfkit.ppo, or one of grpo, rloo, reinforce_pp, "
        "reinforce_pp_baseline",
    ),
    (
        "dpo",
        {"model": "m", "data": "d.jsonl", "output_dir": "OUT", "loss_type": "ipo", "label_smoothing": 0.1},
        "--label-smoothing applies to --loss-type sigmoid only, not ipo",
        "label_smoothing applies to loss_type='sigmoid' only, not ipo",
    ),
    (
        "generate",
        {"model": "m", "data": "d.jsonl", "output": "o.jsonl", "temperature": 0.0},
        "--temperature must be > 0, got 0.0",
        "temperature must be > 0, got 0.0",
    ),
    (
        "label",
        {"output_dir": "OUT", "port": 70000},
        "--port must be in 0..65535, got 70000",
        "port must be in 0..65535, got 70000",
    ),
]


def _argv(command: str, options: dict) -> list[str]:
    argv = [command]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


@pytest.mark.parametrize(("command", "options", "cli_message", "api_message"), CASES)
def test_the_same_bad_options_are_named_as_flags_or_as_keywords(
    capsys, tmp_path, command, options, cli_message, api_message
):
    options = {k: str(tmp_path / v) if v == "OUT" else v for k, v in options.items()}
    code, _, err = run_cli(capsys, *_argv(command, options))
    assert code == 1 and err.splitlines() == [f"error: {cli_message}"]
    with pytest.raises(rlhfkit.UserError) as raised:
        getattr(rlhfkit, command)(**options)
    assert str(raised.value) == api_message


def test_a_check_made_while_running_names_the_option_as_the_caller_wrote_it(capsys, tmp_path):
    """Not only the config's own checks: a reward function checked when the run starts, an output path."""
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Question {i}?"} for i in range(16)])
    missing = tmp_path / "nowhere.py"
    options = {"model": "m", "data": str(prompts), "output_dir": str(tmp_path / "run")}
    code, _, err = run_cli(capsys, "grpo", *_argv("grpo", options)[1:], "--reward-fn", f"{missing}:f")
    assert code == 1 and err.splitlines() == [f"error: --reward-fn {missing}:f: {missing} does not exist"]
    with pytest.raises(rlhfkit.UserError) as raised:
        rlhfkit.grpo(**options, reward_fns=[f"{missing}:f"])
    assert str(raised.value) == f"reward_fns item '{missing}:f': {missing} does not exist"

    folder = tmp_path / "a-folder"
    folder.mkdir()
    code, _, err = run_cli(capsys, "generate", "--model", "m", "--data", prompts, "--output", folder)
    assert code == 1 and err.splitlines() == [f"error: {folder}: --output is a directory; give a .jsonl file path"]
    with pytest.raises(rlhfkit.UserError) as raised:
        rlhfkit.generate(model="m", data=prompts, output=folder)
    assert str(raised.value) == f"{folder}: output is a directory; give a .jsonl file path"


def _scored_rows(tmp_path):
    return write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "Question: hi? Answer:", "response": " hello"}] * 2)


def test_a_causal_lm_as_the_reward_model_is_named_so_with_how_to_make_one(tiny_model_dir, tmp_path, capsys):
    rows = _scored_rows(tmp_path)
    code, _, err = run_cli(
        capsys, "score", "--reward-model", tiny_model_dir, "--data", rows, "--output", tmp_path / "cli.jsonl"
    )
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {tiny_model_dir}: is a causal LM (GPT2LMHeadModel), not a reward model")
    assert f"rlhfkit rm --model {tiny_model_dir} --data PREFS.jsonl --output-dir OUT" in err
    assert "output label" not in err

    with pytest.raises(rlhfkit.UserError) as raised:
        rlhfkit.score(reward_model=tiny_model_dir, data=rows, output=tmp_path / "api.jsonl")
    message = str(raised.value)
    assert message.startswith(f"{tiny_model_dir}: is a causal LM (GPT2LMHeadModel), not a reward model")
    assert message.endswith(f"rlhfkit.rm(model='{tiny_model_dir}', data='PREFS.jsonl', output_dir='OUT')")
    assert not (tmp_path / "api.jsonl").exists()


@pytest.mark.parametrize("command", ["ppo", "grpo", "rloo"])
def test_online_rl_refuses_a_causal_lm_as_the_reward_model(tiny_model_dir, tmp_path, command):
    prompts = [{"prompt": f"Question: what does bob want {i}? Answer:"} for i in range(8)]
    options = {"num_generations": 2} if command != "ppo" else {}
    with pytest.raises(rlhfkit.UserError) as raised:
        getattr(rlhfkit, command)(
            model=str(tiny_model_dir),
            reward_model=str(tiny_model_dir),
            data=prompts,
            output_dir=tmp_path,
            max_steps=1,
            batch_size=4,
            max_new_tokens=4,
            progress=False,
            **options,
        )
    assert "is a causal LM (GPT2LMHeadModel), not a reward model" in str(raised.value)
    assert "rlhfkit.rm(model=" in str(raised.value)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_reward_model_made_by_rm_still_loads(tiny_model_dir, tmp_path):
    """The causal-LM check looks at config.json's architectures: a sequence classifier passes it."""
    from rlhfkit.models.loading import causal_lm_class, load_reward_model, load_tokenizer
    from rlhfkit.models.reward import build_reward_model

    tokenizer = load_tokenizer(str(tiny_model_dir))
    build_reward_model(str(tiny_model_dir), tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert causal_lm_class(str(tiny_model_dir)) == "GPT2LMHeadModel"
    assert causal_lm_class(str(tmp_path)) is None
    assert load_reward_model(str(tmp_path)).config.num_labels == 1
