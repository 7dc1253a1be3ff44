"""LoRA runs as PEFT users expect: the adapter alone with --save-merged false (loadable with
PeftModel.from_pretrained), `rlhfkit merge` giving the merged save, and reward models with LoRA."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

import rlhfkit
from rlhfkit.errors import UserError
from rlhfkit.models import loading
from tests.helpers import run_cli, sft_args, sft_rows, write_jsonl
from tests.trainers.rm.rm_helpers import preference_rows

LORA = {"lora_r": 4, "lora_alpha": 16, "max_steps": 6, "learning_rate": 1e-2, "batch_size": 8}


@pytest.fixture(scope="module")
def sft_runs(tiny_model_dir, tmp_path_factory):
    """The same LoRA SFT run saved merged (the default) and adapter-only."""
    d = tmp_path_factory.mktemp("adapters")
    data = write_jsonl(d / "sft.jsonl", sft_rows(32))
    for name, merged in (("merged", True), ("adapter", False)):
        rlhfkit.sft(
            model=str(tiny_model_dir),
            data=str(data),
            output_dir=str(d / name),
            save_merged=merged,
            progress=False,
            **LORA,
        )
    return d


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_adapter_only_save_loads_with_peft_and_gives_the_merged_models_logits(sft_runs, tiny_model_dir):
    adapter_dir = sft_runs / "adapter"
    assert (adapter_dir / "adapter_config.json").is_file() and (adapter_dir / "adapter_model.safetensors").is_file()
    assert (adapter_dir / "tokenizer.json").is_file()
    assert not (adapter_dir / "model.safetensors").exists() and not (adapter_dir / "adapter").exists()
    assert (sft_runs / "merged" / "model.safetensors").is_file()  # the default: merged weights
    assert (sft_runs / "merged" / "adapter" / "adapter_config.json").is_file()  # and the adapter beside them
    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir).eval()
    merged = AutoModelForCausalLM.from_pretrained(sft_runs / "merged").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert torch.allclose(logits(peft, ids), logits(merged, ids), atol=1e-5)
    assert (logits(peft, ids) - logits(base, ids)).abs().max() > 1e-3  # the adapter was trained


def test_merge_gives_the_merged_save(sft_runs, capsys):
    out = sft_runs / "merged-later"
    code, stdout, err = run_cli(capsys, "merge", "--adapter", sft_runs / "adapter", "--output-dir", out)
    assert code == 0, err
    assert f"merged model saved to {out.resolve()}" in err.splitlines()  # the command line's messages, on stderr
    a, b = load_file(out / "model.safetensors"), load_file(sft_runs / "merged" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "tokenizer.json").is_file()
    # the Python API does the same
    result = rlhfkit.merge(adapter=str(sft_runs / "adapter"), output_dir=str(sft_runs / "merged-api"))
    c = load_file(result.output_dir / "model.safetensors")
    assert max(float((a[k] - c[k]).abs().max()) for k in a) == 0.0


def test_merge_and_the_commands_name_what_is_wrong_with_an_adapter_folder(sft_runs, tmp_path, capsys):
    code, _, err = run_cli(capsys, "merge", "--adapter", sft_runs / "merged", "--output-dir", tmp_path / "x")
    assert code == 1 and "not a LoRA adapter folder (no adapter_config.json) (a merged model" in err
    config = json.loads((sft_runs / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in (sft_runs / "adapter").iterdir():
        if f.is_file():
            (moved / f.name).write_bytes(f.read_bytes())
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="give it with model"):
        rlhfkit.merge(adapter=str(moved), output_dir=str(tmp_path / "y"))
    # an adapter-only folder whose base is gone, given where a model is expected, says how to merge it
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(8))
    code, _, err = run_cli(capsys, *sft_args(moved, data, tmp_path / "out", max_steps=1))
    assert code == 1 and "base model" in err and "rlhfkit merge --adapter" in err and "--model BASE" in err


def test_an_adapter_folder_is_a_model_wherever_one_is_expected(sft_runs, tiny_model_dir, prefs, tmp_path):
    """A run on an adapter-only folder (its base loaded, the adapter merged in memory) is the run on the merged
    save: the same weights and the same random draws. So a pipeline of LoRA runs saves adapters on adapters."""
    adapter, merged = sft_runs / "adapter", sft_runs / "merged"
    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    base = logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), ids)
    loaded = loading.load_causal_lm(str(adapter))
    assert all(p.requires_grad for p in loaded.parameters())  # trainable, as from_pretrained leaves a model
    from_adapter = logits(loaded.eval(), ids)
    assert torch.allclose(from_adapter, logits(loading.load_causal_lm(str(merged)).eval(), ids), atol=1e-5)
    assert (from_adapter - base).abs().max() > 1e-3
    assert (
        loading.config_folder(str(adapter)) == tiny_model_dir and loading.check_kind(str(adapter), "causal LM") is None
    )
    # SFT continued from each, the adapter's run saving its adapter alone: on the first adapter, equal models
    data = write_jsonl(tmp_path / "sft.jsonl", sft_rows(32))
    for name, start, keep_merged in (("on-merged", merged, True), ("on-adapter", adapter, False)):
        rlhfkit.sft(
            model=str(start), data=str(data), output_dir=str(tmp_path / name), save_merged=keep_merged, seed=3,
            progress=False, **LORA,
        )  # fmt: skip
    second = tmp_path / "on-adapter"
    assert loading.adapter_chain(str(second)) == [str(second), str(adapter.resolve()), str(tiny_model_dir.resolve())]
    a = logits(loading.load_causal_lm(str(second)).eval(), ids)
    b = logits(loading.load_causal_lm(str(tmp_path / "on-merged")).eval(), ids)
    assert torch.allclose(a, b, atol=1e-5) and (a - from_adapter).abs().max() > 1e-3
    # a reward model with LoRA from each: the adapter-only one (a reward model's adapter on a causal LM's adapter)
    # scores as the merged one
    train, _ = prefs
    for name, start, keep_merged in (("rm-merged", merged, True), ("rm-adapter", adapter, False)):
        rlhfkit.rm(
            model=str(start), data=str(train), output_dir=str(tmp_path / name), save_merged=keep_merged, lora_r=4,
            max_steps=6, learning_rate=1e-2, batch_size=16, max_length=48, progress=False,
        )  # fmt: skip
    assert not (tmp_path / "rm-adapter" / "model.safetensors").exists()
    with pytest.raises(UserError, match="is a reward model"):
        loading.check_kind(str(tmp_path / "rm-adapter"), "causal LM")
    rows = preference_rows(20, seed=3)
    scores = {
        name: rlhfkit.models.reward.RewardScorer.load(str(tmp_path / name), torch.device("cpu"))
        .score([r["prompt"] for r in rows], [r["chosen"] for r in rows])
        .mean
        for name in ("rm-merged", "rm-adapter")
    }
    assert torch.allclose(scores["rm-merged"], scores["rm-adapter"], atol=1e-4), scores
    assert scores["rm-adapter"].std() > 0


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefs")
    return write_jsonl(d / "train.jsonl", preference_rows(160, seed=1)), write_jsonl(
        d / "eval.jsonl", preference_rows(60, seed=2)
    )


def test_reward_model_with_lora_learns_and_merges(tiny_model_dir, prefs, tmp_path):
    train, held_out = prefs
    common = dict(
        model=str(tiny_model_dir), data=str(train), eval_data=str(held_out), lora_r=8, max_steps=30,
        learning_rate=1e-2, batch_size=16, eval_steps=30, progress=False, max_length=48,
    )  # fmt: skip
    untrained = {**common, "max_steps": 1, "learning_rate": 1e-9, "eval_steps": 1}
    before = rlhfkit.rm(**untrained, output_dir=str(tmp_path / "untrained")).metrics
    result = rlhfkit.rm(**common, output_dir=str(tmp_path / "rm"))
    assert result.metrics["eval/accuracy"] > max(0.8, before["eval/accuracy"] + 0.2), (before, result.metrics)
    assert result.metrics["eval/loss"] < before["eval/loss"]
    # saved merged: a plain one-output classifier whose scores are the trained model's
    out = tmp_path / "rm"
    assert (out / "reward_stats.json").is_file() and (out / "adapter" / "adapter_config.json").is_file()
    plain = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert not any("lora" in k or "modules_to_save" in k for k in plain.state_dict())
    scorer = rlhfkit.models.reward.RewardScorer.load(str(out), torch.device("cpu"))
    rows = preference_rows(40, seed=3)
    chosen = scorer.score([r["prompt"] for r in rows], [r["chosen"] for r in rows]).mean
    rejected = scorer.score([r["prompt"] for r in rows], [r["rejected"] for r in rows]).mean
    assert float((chosen > rejected).float().mean()) > 0.8
    # adapter-only, then merged later: the same classifier
    rlhfkit.rm(**common, output_dir=str(tmp_path / "rm-adapter"), save_merged=False)
    assert (tmp_path / "rm-adapter" / "reward_stats.json").is_file()
    merged = rlhfkit.merge(adapter=str(tmp_path / "rm-adapter"), output_dir=str(tmp_path / "rm-merged")).output_dir
    a, b = load_file(out / "model.safetensors"), load_file(merged / "model.safetensors")
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    assert (merged / "reward_stats.json").read_text() == (out / "reward_stats.json").read_text()
