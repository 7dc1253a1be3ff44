"""The one switch: ``--accel auto|off`` (``RLHFKIT_ACCEL=0`` its environment form, the flag winning), set for the
length of a command, and what ``auto`` means on each device (``rlhfkit.accel.choices``)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from rlhfkit import accel
from rlhfkit.cli.main import COMMANDS, execute
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import UserError

SFT = ["--model", "m", "--data", "d.jsonl", "--output-dir", "out"]


def sft_config(argv, monkeypatch, env=None):
    if env is None:
        monkeypatch.delenv(accel.SWITCH, raising=False)
    else:
        monkeypatch.setenv(accel.SWITCH, env)
    return parse_config("rlhfkit sft", COMMANDS["sft"].config, SFT + argv)[0]


def test_the_flag_wins_over_the_environment_which_sets_the_default(monkeypatch, tmp_path):
    assert sft_config([], monkeypatch).run.accel == "auto"
    assert sft_config([], monkeypatch, env="0").run.accel == "off"
    assert sft_config([], monkeypatch, env="off").run.accel == "off"
    assert sft_config([], monkeypatch, env="1").run.accel == "auto"
    assert sft_config(["--accel", "auto"], monkeypatch, env="0").run.accel == "auto"
    assert sft_config(["--accel", "off"], monkeypatch, env="1").run.accel == "off"
    (tmp_path / "c.yaml").write_text("accel: off\n")  # YAML reads a bare off as false
    assert sft_config(["--config", str(tmp_path / "c.yaml")], monkeypatch).run.accel == "off"
    with pytest.raises(UserError, match="accel must be one of auto, off"):
        sft_config(["--accel", "fast"], monkeypatch)


@pytest.mark.parametrize("command", ["sft", "rm", "dpo", "ppo", "grpo", "rloo", "generate", "score", "eval", "demo"])
def test_every_command_that_runs_a_model_has_the_switch(command):
    names = {f.name for part in _parts(COMMANDS[command].config()) for f in dataclasses.fields(part)}
    assert "accel" in names


def _parts(config):
    yield config
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from _parts(value)


@pytest.mark.parametrize("env", [None, "0"])
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_command_runs_under_its_mode_and_the_environment_is_put_back(monkeypatch, mode, env):
    import rlhfkit.trainers.sft

    config = sft_config(["--accel", mode], monkeypatch, env=env)
    seen = []
    monkeypatch.setattr(rlhfkit.trainers.sft, "train", lambda cfg: seen.append(accel.enabled()))
    execute("sft", config)
    assert seen == [mode == "auto"]
    assert os.environ.get(accel.SWITCH) == env


def test_what_auto_means_on_each_device(monkeypatch):
    monkeypatch.delenv(accel.SWITCH, raising=False)
    cpu, cuda = accel.choices("cpu"), accel.choices("cuda")
    assert all(dataclasses.astuple(cpu))  # on the CPU every piece applies
    # on a GPU nothing fitted to the CPU: padded batches on the fused attention kernels, no oneDNN, no kept heap
    assert not (cuda.packing or cuda.onednn_linears or cuda.kept_heap or cuda.value_pass_apart)
    assert cuda.kernel_swaps and cuda.lean_decode and cuda.vocab_blocks
    with accel.switched("off"):
        assert not accel.enabled()
        assert not any(dataclasses.astuple(accel.choices("cpu"))) and not any(
            dataclasses.astuple(accel.choices("cuda"))
        )
    assert accel.enabled()
    with accel.switched("auto", cpu=True):
        assert accel.run_device().type == "cpu"


def test_single_pieces_can_be_left_off_under_auto(monkeypatch):
    monkeypatch.delenv(accel.SWITCH, raising=False)
    monkeypatch.setenv(accel.SKIP, "packing, kept_heap")
    cpu = accel.choices("cpu")
    assert not cpu.packing and not cpu.kept_heap and cpu.onednn_linears and cpu.vocab_blocks
    assert accel.skipped("packing") and not accel.skipped("fused_lora") and accel.on("fused_lora")
    monkeypatch.setenv(accel.SKIP, "packing,warp_drive")
    with pytest.raises(ValueError, match="unknown pieces \\['warp_drive'\\]"):
        accel.choices("cpu")
    with pytest.raises(ValueError, match="unknown performance piece"):
        accel.skipped("warp_drive")
