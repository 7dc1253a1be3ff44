"""`rlhfkit rm`: learning a preference, score statistics, exact accumulation and resume, input errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.errors import UserError
from rlhfkit.models.reward import RewardScorer
from rlhfkit.trainers import rm

from .rm_helpers import preference_rows, reply_scores, rm_config, write_jsonl

FAST = ["--learning-rate", "3e-3", "--batch-size", "16", "--max-length", "48"]


def metrics(out) -> list[dict]:
    """Logged metrics without the wall-clock timings (``time/...``), which differ between any two runs."""
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def weights(out) -> dict[str, torch.Tensor]:
    return load_file(str(Path(out) / "model.safetensors"))


@pytest.fixture(scope="module")
def trained(tiny_lm, task_data, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("rm") / "out"
    rm.train(
        rm_config(
            [
                "--model",
                tiny_lm,
                "--data",
                task_data["train"],
                "--eval-data",
                task_data["eval"],
                "--output-dir",
                str(out),
                "--max-steps",
                "40",
                "--eval-steps",
                "20",
            ]
            + FAST
        )
    )
    return str(out)


def test_learns_the_preference_on_held_out_pairs(trained, task_data):
    logged = metrics(trained)
    evals = [m for m in logged if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [20, 40]
    assert evals[-1]["eval/accuracy"] >= 0.9
    assert evals[-1]["eval/loss"] < 0.3 < 0.69 < logged[0]["loss"] + 0.1  # from ~log 2 at the start
    assert {"loss", "accuracy", "reward/chosen", "reward/rejected", "reward/margin", "learning_rate"} <= set(logged[-1])
    # The saved model, loaded for scoring texts, ranks the held-out pairs as the trainer measured.
    rows = [json.loads(line) for line in Path(task_data["eval"]).read_text().splitlines()]
    scorer = RewardScorer.load(trained, "cpu")
    chosen = scorer.score([r["prompt"] for r in rows], [r["chosen"] for r in rows]).mean
    rejected = scorer.score([r["prompt"] for r in rows], [r["rejected"] for r in rows]).mean
    assert float((chosen > rejected).float().mean()) == pytest.approx(evals[-1]["eval/accuracy"], abs=1e-6)


def test_reward_stats_are_over_the_training_responses(trained, task_data):
    stats = json.loads((Path(trained) / "reward_stats.json").read_text())
    rows = [json.loads(line) for line in Path(task_data["train"]).read_text().splitlines()]
    scorer = RewardScorer.load(trained, "cpu")
    prompts = [r["prompt"] for r in rows] * 2
    scores = scorer.score(prompts, [r["chosen"] for r in rows] + [r["rejected"] for r in rows]).mean
    assert stats["count"] == 2 * len(rows)
    assert stats["mean"] == pytest.approx(float(scores.mean()), abs=1e-5)
    assert stats["std"] == pytest.approx(float(scores.std()), abs=1e-5)
    assert scorer.stats == {"mean": stats["mean"], "std": stats["std"]}
    assert (stats["max_length"], stats["max_prompt_length"]) == (48, 128)


def test_gradient_accumulation_matches_one_big_batch(tiny_lm, task_data, tmp_path):
    common = [
        "--model",
        tiny_lm,
        "--data",
        task_data["train"],
        "--max-steps",
        "3",
        "--learning-rate",
        "3e-3",
        "--center-coef",
        "0.1",
        "--max-length",
        "48",
    ]
    rm.train(rm_config(common + ["--output-dir", str(tmp_path / "a"), "--batch-size", "8"]))
    rm.train(
        rm_config(
            common + ["--output-dir", str(tmp_path / "b"), "--batch-size", "8", "--gradient-accumulation-steps", "2"]
        )
    )
    la, lb = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert la[0]["loss"] != la[-1]["loss"]
    for key in ("loss", "accuracy", "grad_norm"):  # grad_norm: Adam hides a wrongly scaled loss, the norm does not
        assert [m[key] for m in la] == pytest.approx([m[key] for m in lb], rel=1e-5, abs=1e-6)
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    for name in a:  # Adam divides by sqrt(v): float noise in near-zero gradients grows to ~1e-4 on some CPUs
        torch.testing.assert_close(a[name], b[name], atol=3e-4, rtol=0)


def test_resume_ends_exactly_as_an_uninterrupted_run(tiny_lm, task_data, tmp_path):
    out = tmp_path / "run"
    argv = [
        "--model",
        tiny_lm,
        "--data",
        task_data["train"],
        "--eval-data",
        task_data["eval"],
        "--output-dir",
        str(out),
        "--max-steps",
        "6",
        "--save-steps",
        "3",
        "--eval-steps",
        "3",
    ] + FAST
    rm.train(rm_config(argv))
    full_weights, full_metrics = weights(out), metrics(out)
    stats = (out / "reward_stats.json").read_text()
    # Pretend the run was killed after the step-3 checkpoint.
    shutil.rmtree(out / "checkpoints" / "step-6")
    rm.train(rm_config(argv + ["--resume"]))
    for name, value in weights(out).items():
        torch.testing.assert_close(value, full_weights[name], atol=1e-6, rtol=0)
    assert metrics(out) == full_metrics
    assert (out / "reward_stats.json").read_text() == stats


def test_sft_rows_are_refused_with_file_and_line(tiny_lm, tmp_path):
    bad = write_jsonl(tmp_path / "sft.jsonl", preference_rows(2, seed=0) + [{"prompt": "hi", "completion": "there"}])
    with pytest.raises(UserError, match=r"sft\.jsonl: line 3: .*chosen"):
        rm.train(rm_config(["--model", tiny_lm, "--data", str(bad), "--output-dir", str(tmp_path / "o")]))


def test_implicit_prompt_pairs_train_end_to_end(tiny_lm, tmp_path):
    """Anthropic-HH style rows: no 'prompt', the shared transcript up to the last 'Assistant:' is the prompt."""

    def hh(rows):
        return [
            {
                "chosen": f"\n\nHuman: {r['prompt']}\n\nAssistant:{r['chosen']}",
                "rejected": f"\n\nHuman: {r['prompt']}\n\nAssistant:{r['rejected']}",
            }
            for r in rows
        ]

    train = write_jsonl(tmp_path / "hh_train.jsonl", hh(preference_rows(320, seed=1)))
    held_out = preference_rows(100, seed=2)
    evals = write_jsonl(tmp_path / "hh_eval.jsonl", hh(held_out))
    out = tmp_path / "rm"
    rm.train(
        rm_config(
            [
                "--model",
                tiny_lm,
                "--data",
                str(train),
                "--eval-data",
                str(evals),
                "--output-dir",
                str(out),
                "--max-steps",
                "40",
                "--max-length",
                "64",
            ]
            + FAST[:4]
        )
    )
    assert metrics(out)[-1]["eval/accuracy"] >= 0.9
    # Scoring the split form (prompt = transcript through 'Assistant:', response = the reply) agrees.
    scorer = RewardScorer.load(str(out), "cpu")
    prompts = [f"\n\nHuman: {r['prompt']}\n\nAssistant:" for r in held_out]
    chosen = scorer.score(prompts, [r["chosen"] for r in held_out]).mean
    rejected = scorer.score(prompts, [r["rejected"] for r in held_out]).mean
    assert float((chosen > rejected).float().mean()) == pytest.approx(metrics(out)[-1]["eval/accuracy"], abs=1e-6)


def test_pairs_scored_side_by_side_match_each_reply_scored_alone(trained, task_data):
    """Evaluation and the statistics score a pair's two replies in one forward (their prompt laid out once
    when packed): the same scores as each reply scored on its own, for all pairs or a subset in its order."""
    from rlhfkit import accel
    from rlhfkit.data.schema import load_examples
    from rlhfkit.models.loading import load_reward_model, load_tokenizer
    from rlhfkit.models.reward import score_encoded
    from rlhfkit.trainers.rm import encode_all, score_pairs

    tokenizer = load_tokenizer(trained)
    model = load_reward_model(trained)
    cfg = rm_config(["--model", trained, "--data", task_data["eval"], "--output-dir", "unused"] + FAST)
    pairs = encode_all(tokenizer, load_examples(task_data["eval"], "preference", "eval"), cfg.data)
    pad = tokenizer.pad_token_id
    for pack in (True, False):
        with accel.switched("auto", options={"pack_sequences": pack}):  # as `rlhfkit rm --pack-sequences PACK`
            chosen, rejected = score_pairs(model, pairs, pad, 16, "cpu")
            assert torch.allclose(chosen, score_encoded(model, pairs.chosen, pad, 16, "cpu"), atol=1e-5)
            assert torch.allclose(rejected, score_encoded(model, pairs.rejected, pad, 16, "cpu"), atol=1e-5)
    some = [7, 3, 50, 0]
    with accel.switched("auto"):
        chosen_some, rejected_some = score_pairs(model, pairs, pad, 6, "cpu", some)
    assert torch.allclose(chosen_some, chosen[some], atol=1e-5)
    assert torch.allclose(rejected_some, rejected[some], atol=1e-5)


def test_reward_stats_of_many_pairs_come_from_a_fixed_draw_of_them(tiny_lm, task_data, tmp_path, monkeypatch):
    monkeypatch.setattr(rm, "STATS_PAIRS", 50)
    picked = rm.stats_pairs(320)
    assert len(set(picked)) == 50 and picked == sorted(picked) and picked == rm.stats_pairs(320)
    assert rm.stats_pairs(40) == list(range(40))
    out = tmp_path / "rm"
    args = ["--model", tiny_lm, "--data", task_data["train"], "--output-dir", str(out), "--max-steps", "2"]
    rm.train(rm_config(args + FAST))
    stats = json.loads((out / "reward_stats.json").read_text())
    rows = [json.loads(line) for line in Path(task_data["train"]).read_text().splitlines()]
    rows = [rows[i] for i in picked]
    scores = reply_scores(RewardScorer.load(str(out), "cpu"), rows)
    assert stats["count"] == 100
    assert stats["mean"] == pytest.approx(float(scores.mean()), abs=1e-5)
    assert stats["std"] == pytest.approx(float(scores.std()), abs=1e-5)
