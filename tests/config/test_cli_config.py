"""Config parsing: defaults < YAML < flags, spellings, rejection of unknown/invalid options, --help, config.yaml."""

from __future__ import annotations

import re

import pytest
import yaml

from rlhfkit.cli.main import COMMANDS
from rlhfkit.config.commands import GenerateConfig, PPOConfig, SFTConfig
from rlhfkit.config.parse import flat_dict, leaves, parse_config, save_config
from rlhfkit.errors import UserError

from ..helpers import run_cli

REQUIRED = ["--model", "m", "--data", "d.jsonl", "--output-dir", "out"]


def parse(argv, cls=SFTConfig):
    return parse_config("rlhfkit sft", cls, argv)[0]


def test_flag_beats_yaml_beats_default(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("learning_rate: 0.003\nbatch_size: 4\noptim:\n  warmup_steps: 7\n", encoding="utf-8")
    cfg = parse(REQUIRED + ["--config", str(cfg_file), "--batch-size", "2"])
    assert cfg.optim.batch_size == 2  # flag beats YAML
    assert cfg.optim.learning_rate == 0.003  # YAML beats default
    assert cfg.optim.warmup_steps == 7  # keys nested under a part name work too
    assert cfg.optim.max_grad_norm == SFTConfig().optim.max_grad_norm == 1.0  # default
    assert cfg.model.model == "m" and cfg.run.output_dir == "out"


def test_flag_beats_yaml_whatever_the_order(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("seed: 5\n", encoding="utf-8")
    assert parse(REQUIRED + ["--seed", "9", "--config", str(cfg_file)]).run.seed == 9


def test_dashes_and_underscores_both_work(tmp_path):
    a = parse(REQUIRED + ["--gradient-accumulation-steps", "3", "--max_steps", "11"])
    b = parse(REQUIRED + ["--gradient_accumulation_steps", "3", "--max-steps", "11"])
    assert a == b and a.optim.gradient_accumulation_steps == 3 and a.optim.max_steps == 11
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("max-prompt-length: 17\n", encoding="utf-8")
    assert parse(REQUIRED + ["--config", str(cfg_file)]).data.max_prompt_length == 17


def test_bool_and_optional_values():
    cfg = parse(REQUIRED + ["--resume", "--progress", "false"])
    assert cfg.run.resume is True and cfg.run.progress is False
    ppo = parse_config(
        "rlhfkit ppo", PPOConfig, REQUIRED + ["--reward-model", "rm", "--target-kl", "6", "--value-clip", "none"]
    )[0]
    assert ppo.kl.target_kl == 6.0 and ppo.critic.value_clip is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--learning-rat", "0.1"], "unknown option --learning-rat; did you mean --learning-rate?"),
        (["--max_step", "3"], "unknown option --max_step; did you mean --max-steps?"),
        (["--lr", "1e-3"], "unknown option --lr; did you mean --learning-rate?"),  # TRL's and Trainer's spelling
        (
            ["--per-device-train-batch-size=4"],
            "unknown option --per-device-train-batch-size; did you mean --batch-size?",
        ),
        (["--frobnicate", "1"], "unknown option --frobnicate (see rlhfkit sft --help)"),
        (["stray"], "unrecognized arguments: stray (see rlhfkit sft --help)"),
    ],
)
def test_unknown_flag_is_rejected_with_a_clear_message(capsys, args, message):
    code, _, err = run_cli(capsys, "sft", *REQUIRED, *args)
    assert code != 0 and "Traceback" not in err
    assert err.strip().splitlines() == [f"error: rlhfkit sft: {message}"]


def test_unknown_keywords_and_yaml_keys_get_the_option_they_meant(tmp_path):
    import rlhfkit

    with pytest.raises(UserError, match=r"^rlhfkit\.sft: unknown option 'lr'; did you mean learning_rate\?$"):
        rlhfkit.sft(model="m", data="d", output_dir=str(tmp_path), lr=1e-3)
    with pytest.raises(UserError, match=r"^rlhfkit\.grpo: unknown option 'reward_fnss'; did you mean reward_fns\?$"):
        rlhfkit.grpo(model="m", data="d", output_dir=str(tmp_path), reward_fnss=[len])
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("max_step: 3\n", encoding="utf-8")
    with pytest.raises(
        UserError, match=r"c\.yaml: unknown option 'max_step' for rlhfkit sft; did you mean 'max_steps'\?"
    ):
        parse(REQUIRED + ["--config", str(cfg_file)])


def test_unknown_yaml_key_is_rejected(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("learning_rate: 0.1\nkl_coef: 0.2\n", encoding="utf-8")  # a PPO option, not an SFT one
    with pytest.raises(UserError, match=r"c\.yaml: unknown option 'kl_coef' for rlhfkit sft"):
        parse(REQUIRED + ["--config", str(cfg_file)])


@pytest.mark.parametrize(
    "yaml_text,message",
    [
        ("batch_size: two\n", r"c\.yaml: option 'batch_size' must be an integer, got 'two'"),
        ("batch_size: 2.5\n", r"option 'batch_size' must be an integer"),
        ("lr_scheduler: step\n", r"option 'lr_scheduler' must be one of linear, cosine, constant"),
        ("resume: maybe\n", r"option 'resume' must be true or false"),
        ("- a\n- b\n", r"a config file must be a mapping"),
    ],
)
def test_invalid_yaml_values_are_rejected(tmp_path, yaml_text, message):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(UserError, match=message):
        parse(REQUIRED + ["--config", str(cfg_file)])


@pytest.mark.parametrize(
    "yaml_text,where",
    [
        ("learning_rate: 1e-5\nmax_steps: [1, 2\nbatch_size: 4\n", "line 3, column 11"),  # unclosed list
        ("learning_rate: 1e-5\nseed: 1\n  batch_size: 2\n", "line 3, column 13"),  # stray indentation
        ('seed: 1\noutput_dir: "open\n', "line 3, column 1"),  # unclosed quote, found at the end of the file
        ("seed: 1\n\tbatch_size: 2\n", "line 2, column 1"),  # a tab
    ],
)
def test_yaml_syntax_error_names_its_line(capsys, tmp_path, yaml_text, where):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text(yaml_text, encoding="utf-8")
    code, _, err = run_cli(capsys, "sft", "--config", str(cfg_file), *REQUIRED)
    assert code == 1 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {cfg_file}: {where}: not valid YAML ("), lines


def test_yaml_no_is_read_as_the_choice_no(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("mixed_precision: no\n", encoding="utf-8")  # YAML 1.1 reads a bare `no` as false
    assert parse(REQUIRED + ["--config", str(cfg_file)]).run.mixed_precision == "no"


def test_missing_required_flag(capsys):
    code, _, err = run_cli(capsys, "sft", "--model", "m", "--data", "d.jsonl")
    assert code != 0 and err.strip().splitlines() == ["error: rlhfkit sft: --output-dir is required"]


def test_out_of_range_values_are_rejected():
    with pytest.raises(UserError, match="--max-steps must be > 0 or -1"):
        parse(REQUIRED + ["--max-steps", "0"])
    with pytest.raises(UserError, match="--temperature must be > 0"):
        parse_config(
            "rlhfkit generate", GenerateConfig, ["--model", "m", "--data", "d", "--output", "o", "--temperature", "0"]
        )


def _squash(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command", ["sft", "generate", "init-model", "ppo"])
def test_help_documents_every_option_with_its_default(capsys, command):
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0
    help_text = _squash(out)
    config = COMMANDS[command].config()
    required = set(getattr(config, "REQUIRED", ()))
    for leaf in leaves(config):
        flag = "--" + leaf.name.replace("_", "-")
        assert leaf.doc, f"{flag} has no docstring"
        # the option's flag, then its docstring and its default (or 'required') in its help entry
        entry = re.search(re.escape(flag) + r"[ ,].*?" + re.escape(_squash(leaf.doc)) + r" \((.*?)\)", help_text)
        assert entry, f"{flag}: docstring missing from --help"
        expected = "required" if leaf.name in required else f"default: {leaf.default!r}"
        assert entry.group(1) == expected


def test_top_level_usage_lists_commands(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and all(name in out for name in ("sft", "generate", "init-model"))
    code, _, err = run_cli(capsys, "frobnicate")
    assert code != 0 and "unknown command 'frobnicate'" in err


def test_config_yaml_is_written_and_reads_back(tmp_path):
    cfg = parse(REQUIRED + ["--learning-rate", "3e-3", "--lr-scheduler", "cosine", "--resume"])
    path = save_config(cfg, tmp_path)
    assert yaml.safe_load(path.read_text())["learning_rate"] == 0.003
    again = parse_config("rlhfkit sft", SFTConfig, ["--config", str(path)])[0]
    assert again == cfg
    ppo = parse_config("rlhfkit ppo", PPOConfig, REQUIRED + ["--reward-model", "rm", "--value-clip", "none"])[0]
    again = parse_config("rlhfkit ppo", PPOConfig, ["--config", str(save_config(ppo, tmp_path / "ppo"))])[0]
    assert again == ppo and flat_dict(again)["value_clip"] is None
