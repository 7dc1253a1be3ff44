"""The Python API: the commands as functions, with the CLI's options, defaults, validation and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import rlhfkit
from rlhfkit.cli.main import COMMANDS
from rlhfkit.config.commands import DPOConfig, SFTConfig
from rlhfkit.config.parse import flat_dict, parse_config

from ..helpers import read_jsonl, sft_rows


def preference_rows(n: int = 32) -> list[dict]:
    rows = sft_rows(n, seed=1)
    return [{"prompt": r["prompt"], "chosen": r["completion"], "rejected": " no."} for r in rows]


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "sft"
    result = rlhfkit.sft(
        model=str(tiny_model_dir), data=sft_rows(48), output_dir=out, max_steps=30, learning_rate=3e-3, progress=False
    )
    return out, result


def test_sft_on_in_memory_rows_learns_and_returns_its_output(sft_run):
    out, result = sft_run
    assert result.output_dir == Path(out) and result.output is None
    losses = [row["loss"] for row in read_jsonl(out / "metrics.jsonl")]
    assert len(losses) == 30 and losses[-1] <= 0.7 * losses[0], losses
    assert result.metrics["loss"] == pytest.approx(losses[-1])
    # the rows were written beside the run, and its config.yaml names that file: a CLI replay reads it
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["data"] == str(out / "inputs" / "data.jsonl")
    assert read_jsonl(out / "inputs" / "data.jsonl") == sft_rows(48)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "gpt2"


def test_keyword_options_resolve_as_the_cli_flags_do(tmp_path):
    """Defaults and values come from one definition: the same config from flags and from keywords."""
    argv = ["--model", "m", "--data", "d.jsonl", "--output-dir", str(tmp_path), "--kl-coef", "0.2", "--lora-r", "4"]
    from_flags, _ = parse_config("rlhfkit ppo", COMMANDS["ppo"].config, argv + ["--reward-model", "r"])
    from rlhfkit.config.parse import build_config

    values = {
        "model": "m",
        "data": "d.jsonl",
        "output_dir": str(tmp_path),
        "kl_coef": 0.2,
        "lora_r": 4,
        "reward_model": "r",
    }
    from_keywords = build_config("rlhfkit.ppo", COMMANDS["ppo"].config, {k: (v, k) for k, v in values.items()})
    assert flat_dict(from_flags) == flat_dict(from_keywords)
    assert flat_dict(from_keywords)["learning_rate"] == 1e-5  # ppo's own default, as on the command line


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_steps": "many"}, r"rlhfkit\.sft: max_steps must be an integer, got 'many'"),
        ({"klcoef": 0.1}, r"rlhfkit\.sft: unknown option 'klcoef'"),
        ({"learning_rate": -1.0}, r"^learning_rate must be > 0, got -1\.0$"),
        ({"model": ""}, r"^rlhfkit\.sft: model is required$"),
    ],
)
def test_bad_options_raise_user_error(tiny_model_dir, tmp_path, options, message):
    kwargs = {"model": str(tiny_model_dir), "data": sft_rows(8), "output_dir": tmp_path, **options}
    with pytest.raises(rlhfkit.UserError, match=message):
        rlhfkit.sft(**kwargs)


def test_a_bad_row_is_a_user_error_naming_the_written_file_and_row(tiny_model_dir, tmp_path):
    rows = sft_rows(8)
    rows[3] = {"prompt": "Question: hi? Answer:"}  # no completion
    with pytest.raises(rlhfkit.UserError, match=r"inputs/data\.jsonl: line 4: .*completion"):
        rlhfkit.sft(model=str(tiny_model_dir), data=rows, output_dir=tmp_path, max_steps=1)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_config_object_with_overrides_is_not_changed(tiny_model_dir, tmp_path):
    config = SFTConfig()
    config.model.model, config.data.data, config.run.output_dir = str(tiny_model_dir), sft_rows(16), str(tmp_path)
    config.optim.max_steps, config.run.progress = 2, False
    result = rlhfkit.sft(config, learning_rate=1e-3)
    assert result.output_dir == tmp_path and len(read_jsonl(tmp_path / "metrics.jsonl")) == 2
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["learning_rate"] == 1e-3
    assert config.optim.learning_rate == SFTConfig().optim.learning_rate  # the caller's object is untouched
    with pytest.raises(TypeError, match="expected a SFTConfig"):
        rlhfkit.sft(DPOConfig())


def test_rm_ppo_dpo_generate_score_and_evaluate_through_the_api(sft_run, tmp_path):
    sft_dir, _ = sft_run
    prefs = preference_rows(32)
    rm = rlhfkit.rm(
        model=str(sft_dir),
        data=prefs,
        eval_data=prefs[:8],
        output_dir=tmp_path / "rm",
        max_steps=4,
        learning_rate=1e-3,
        progress=False,
    )
    assert {"loss", "accuracy", "eval/accuracy"} <= set(rm.metrics)
    assert (tmp_path / "rm" / "reward_stats.json").is_file()

    prompts = [{"prompt": r["prompt"]} for r in prefs]
    ppo = rlhfkit.ppo(
        model=str(sft_dir),
        reward_model=str(rm.output_dir),
        data=prompts,
        output_dir=tmp_path / "ppo",
        max_steps=2,
        batch_size=8,
        max_new_tokens=6,
        kl_coef=0.1,
        progress=False,
    )
    assert ppo.output_dir == tmp_path / "ppo" and {"reward/score", "kl/ref", "kl/coef"} <= set(ppo.metrics)
    assert ppo.metrics["kl/coef"] == pytest.approx(0.1)

    dpo = rlhfkit.dpo(
        model=str(sft_dir), data=prefs, output_dir=tmp_path / "dpo", max_steps=2, beta=0.2, progress=False
    )
    assert {"loss", "rewards/margin"} <= set(dpo.metrics)

    generated = rlhfkit.generate(
        model=str(ppo.output_dir), data=prompts[:4], output=tmp_path / "gen" / "out.jsonl", max_new_tokens=6
    )
    assert generated.output == tmp_path / "gen" / "out.jsonl"
    assert [r["prompt"] for r in read_jsonl(generated.output)] == [p["prompt"] for p in prompts[:4]]

    scored = rlhfkit.score(reward_model=str(rm.output_dir), data=generated.output, output=tmp_path / "scored.jsonl")
    assert all(isinstance(r["score"], float) for r in read_jsonl(scored.output))

    evaluated = rlhfkit.evaluate(
        model=str(ppo.output_dir),
        data=prompts[:4],
        output=tmp_path / "eval.json",
        reference_model=str(sft_dir),
        max_new_tokens=6,
    )
    assert evaluated.metrics["n"] == 4 and "kl/ref" in evaluated.metrics
    assert json.loads((tmp_path / "eval.json").read_text())["n"] == 4
    assert torch.isfinite(torch.tensor(evaluated.metrics["kl/ref"]))
