"""`rlhfkit rm --ensemble K`: layout, disagreement (std), statistics, `score` output, and resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.data.schema import load_examples
from rlhfkit.models.reward import RewardScorer
from rlhfkit.trainers import rm

from .rm_helpers import preference_rows, reply_scores, rm_config, write_jsonl


def ensemble_argv(tiny_lm, task_data, out) -> list[str]:
    return [
        "--model",
        tiny_lm,
        "--data",
        task_data["train"],
        "--eval-data",
        task_data["eval"],
        "--output-dir",
        str(out),
        "--ensemble",
        "2",
        "--conservative-k",
        "1.5",
        "--max-steps",
        "8",
        "--save-steps",
        "4",
        "--learning-rate",
        "3e-3",
        "--batch-size",
        "16",
        "--max-length",
        "48",
        "--seed",
        "5",
    ]


@pytest.fixture(scope="module")
def ensemble(tiny_lm, task_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ens") / "rm"
    rm.train(rm_config(ensemble_argv(tiny_lm, task_data, out)))
    return out


def test_layout_root_is_member_zero(ensemble):
    info = json.loads((ensemble / "ensemble.json").read_text())
    assert info["members"] == [".", "member-1"] and info["seeds"] == [5, 6] and info["conservative_k"] == 1.5
    for d in (ensemble, ensemble / "member-1"):
        assert (
            (d / "model.safetensors").is_file()
            and (d / "reward_stats.json").is_file()
            and (d / "metrics.jsonl").is_file()
        )
    assert 0.0 <= info["eval"]["accuracy"] <= 1.0 and len(info["eval"]["member_accuracy"]) == 2
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(str(ensemble)).config.num_labels == 1


def test_scores_are_member_mean_and_std(ensemble):
    rows = preference_rows(12, seed=9)
    prompts, responses = [r["prompt"] for r in rows], [r["chosen"] for r in rows]
    scorer = RewardScorer.load(str(ensemble), "cpu")
    assert scorer.is_ensemble and scorer.conservative_k == 1.5
    out = scorer.score(prompts, responses, batch_size=5)
    a = RewardScorer.load(str(ensemble / "member-1"), "cpu").score(prompts, responses).mean
    # The root alone is member 0 (its own reward_stats.json, no ensemble.json in the way).
    single = RewardScorer.load(str(ensemble), "cpu")
    single.members = single.members[:1]
    b = single.score(prompts, responses).mean
    torch.testing.assert_close(out.mean, (a + b) / 2, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, (a - b).abs() / 2**0.5, atol=1e-6, rtol=0)  # unbiased std of two
    assert float(out.std.min()) > 1e-4  # members with different seeds disagree on every row
    torch.testing.assert_close(out.conservative(scorer.conservative_k), out.mean - 1.5 * out.std)


def test_ensemble_stats_are_of_the_mean_score(ensemble, task_data):
    info = json.loads((ensemble / "ensemble.json").read_text())
    rows = [json.loads(line) for line in Path(task_data["train"]).read_text().splitlines()]
    scorer = RewardScorer.load(str(ensemble), "cpu")
    mean = reply_scores(scorer, rows)
    assert info["stats"]["mean"] == pytest.approx(float(mean.mean()), abs=1e-5)
    assert info["stats"]["std"] == pytest.approx(float(mean.std()), abs=1e-5)
    assert scorer.stats == {"mean": info["stats"]["mean"], "std": info["stats"]["std"]}
    member0 = json.loads((ensemble / "reward_stats.json").read_text())
    assert member0["mean"] != pytest.approx(info["stats"]["mean"], abs=1e-4)


def test_ensemble_stats_come_from_the_fixed_draw_of_pairs_a_single_model_uses(
    ensemble, tiny_lm, task_data, tmp_path, monkeypatch
):
    root = tmp_path / "rm"
    shutil.copytree(ensemble, root)
    monkeypatch.setattr(rm, "STATS_PAIRS", 40)
    cfg = rm_config(ensemble_argv(tiny_lm, task_data, root))
    rm.write_ensemble(cfg, [root, root / "member-1"], load_examples(task_data["train"], "preference", "test"), [])
    stats = json.loads((root / "ensemble.json").read_text())["stats"]
    rows = [json.loads(line) for line in Path(task_data["train"]).read_text().splitlines()]
    rows = [rows[i] for i in rm.stats_pairs(len(rows))]
    assert len(rows) == 40
    mean = reply_scores(RewardScorer.load(str(root), "cpu"), rows)
    assert stats["count"] == 80
    assert stats["mean"] == pytest.approx(float(mean.mean()), abs=1e-5)
    assert stats["std"] == pytest.approx(float(mean.std()), abs=1e-5)
    everything = json.loads((ensemble / "ensemble.json").read_text())["stats"]
    assert everything["count"] == 640 and everything["mean"] != pytest.approx(stats["mean"], abs=1e-4)


def test_score_command_adds_score_std(ensemble, tmp_path):
    rows = [{"prompt": r["prompt"], "response": r["rejected"]} for r in preference_rows(4, seed=4)]
    output = tmp_path / "scored.jsonl"
    assert (
        main(
            [
                "score",
                "--reward-model",
                str(ensemble),
                "--data",
                str(write_jsonl(tmp_path / "in.jsonl", rows)),
                "--output",
                str(output),
            ]
        )
        == 0
    )
    written = [json.loads(line) for line in output.read_text().splitlines()]
    expected = RewardScorer.load(str(ensemble), "cpu").score([r["prompt"] for r in rows], [r["response"] for r in rows])
    assert [w["score"] for w in written] == pytest.approx(expected.mean.tolist(), abs=1e-5)
    assert [w["score_std"] for w in written] == pytest.approx(expected.std.tolist(), abs=1e-5)


def test_resume_skips_finished_members_and_continues_the_interrupted_one(ensemble, tiny_lm, task_data, tmp_path):
    out = tmp_path / "rm"
    shutil.copytree(ensemble, out)
    member1 = load_file(str(out / "member-1" / "model.safetensors"))
    root_mtime = (out / "model.safetensors").stat().st_mtime_ns
    info = json.loads((out / "ensemble.json").read_text())
    # Pretend the run was killed while member 1 trained, after its step-4 checkpoint.
    shutil.rmtree(out / "member-1" / "checkpoints" / "step-8")
    (out / "member-1" / "reward_stats.json").unlink()
    (out / "ensemble.json").unlink()
    rm.train(rm_config(ensemble_argv(tiny_lm, task_data, out) + ["--resume"]))
    assert (out / "model.safetensors").stat().st_mtime_ns == root_mtime  # member 0 was not retrained
    for name, value in load_file(str(out / "member-1" / "model.safetensors")).items():
        torch.testing.assert_close(value, member1[name], atol=1e-6, rtol=0)
    again = json.loads((out / "ensemble.json").read_text())
    assert again["stats"] == pytest.approx(info["stats"], abs=1e-6)


def test_a_finished_reward_model_becomes_member_zero_of_the_ensemble_its_seed_would_train(
    ensemble, tiny_lm, task_data, tmp_path
):
    # bench rl_knobs' ensemble: the seed's reward model, then `--ensemble` resuming past it trains the others
    import rlhfkit
    from bench.learning.rl_knobs import ensemble_rm

    pairs = {"model": tiny_lm, "data": task_data["train"], "eval_data": task_data["eval"]}
    settings = {"rm": {"max_steps": 8, "save_steps": 4, "learning_rate": 3e-3, "batch_size": 16, "max_length": 48}}
    common = {"seed": 5, "progress": False, "conservative_k": 1.5}
    rlhfkit.rm(**pairs, output_dir=str(tmp_path / "rm"), **settings["rm"], **common)
    single = load_file(str(tmp_path / "rm" / "model.safetensors"))
    out = ensemble_rm(tmp_path, "rm_ensemble_2", 2, pairs, settings, common)
    info = json.loads((out / "ensemble.json").read_text())
    assert info["members"] == [".", "member-1"] and info["seeds"] == [5, 6]
    member1 = load_file(str(out / "member-1" / "model.safetensors"))
    assert all(torch.equal(value, single[name]) for name, value in load_file(str(out / "model.safetensors")).items())
    # member 1 is the run of seed 6 that training the ensemble from scratch makes (up to float order), not member 0
    reference = load_file(str(ensemble / "member-1" / "model.safetensors"))
    for name, value in member1.items():
        torch.testing.assert_close(value, reference[name], atol=2e-3, rtol=0)
    assert max((member1[name] - single[name]).abs().max().item() for name in single) > 0.05
