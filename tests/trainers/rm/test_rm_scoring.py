"""Where a reward model reads its score, and `rlhfkit score` / RewardScorer on texts."""

from __future__ import annotations

import json

import pytest
import torch

from rlhfkit.cli.main import main
from rlhfkit.data.collate import collate_pairs
from rlhfkit.data.encode import encode_pair
from rlhfkit.models.loading import load_tokenizer
from rlhfkit.models.reward import RewardScorer, ScoreOutput, build_reward_model, is_encoder, sequence_scores
from rlhfkit.trainers import rm

from .rm_helpers import PROMPTS, preference_rows, rm_config, write_jsonl

SHORT = ("Customer: the app crashed.\nAgent:", " thanks we will help")
LONG = (
    "Customer: my order is late.\nAgent:",
    " sorry about the order we will send a new box today please check your account",
)


def _model(path):
    tokenizer = load_tokenizer(path)
    torch.manual_seed(0)
    model = build_reward_model(path, tokenizer).eval()
    with torch.no_grad():
        for p in model.parameters():  # break the symmetry of a fresh head so positions differ clearly
            p.add_(0.05 * torch.randn_like(p))
    return model, tokenizer


def test_score_is_read_at_the_last_real_token_even_when_pad_is_eos(tiny_lm_pad_eos):
    model, tokenizer = _model(tiny_lm_pad_eos)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id and not is_encoder(model)
    short, long = (encode_pair(tokenizer, p, r, 64, 32) for p, r in (SHORT, LONG))
    assert short.response_ids[-1] == tokenizer.eos_token_id
    with torch.no_grad():
        alone = sequence_scores(model, collate_pairs([short], tokenizer.pad_token_id))
        padded = sequence_scores(model, collate_pairs([long, short], tokenizer.pad_token_id))  # short gets padding
        ids = torch.tensor([short.prompt_ids + short.response_ids])
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]  # [L, H], unpadded
        per_position = model.score(hidden)[:, 0]
    assert padded[1] == pytest.approx(float(alone[0]), abs=1e-5)
    assert float(alone[0]) == pytest.approx(float(per_position[-1]), abs=1e-5)  # the EOS position
    assert abs(float(alone[0]) - float(per_position[-2])) > 1e-3  # not the token before it


def test_encoder_score_is_its_pooled_output_and_ignores_padding(tiny_bert):
    model, tokenizer = _model(tiny_bert)
    assert is_encoder(model)
    short, long = (encode_pair(tokenizer, p, r, 64, 32) for p, r in (SHORT, LONG))
    assert short.prompt_ids[0] == tokenizer.cls_token_id
    with torch.no_grad():
        alone = sequence_scores(model, collate_pairs([short], tokenizer.pad_token_id))
        padded = sequence_scores(model, collate_pairs([long, short], tokenizer.pad_token_id))
        own = model(input_ids=torch.tensor([short.prompt_ids + short.response_ids])).logits[0, 0]
    assert float(padded[1]) == pytest.approx(float(alone[0]), abs=1e-5)
    assert float(alone[0]) == pytest.approx(float(own), abs=1e-5)


def test_an_encoder_reward_model_trains(tiny_bert, task_data, tmp_path):
    out = tmp_path / "bert-rm"
    rm.train(
        rm_config(
            [
                "--model",
                tiny_bert,
                "--data",
                task_data["train"],
                "--eval-data",
                task_data["eval"],
                "--output-dir",
                str(out),
                "--max-steps",
                "30",
                "--learning-rate",
                "3e-3",
                "--batch-size",
                "16",
            ]
        )
    )
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["eval/accuracy"] >= 0.9
    assert RewardScorer.load(str(out), "cpu").score([PROMPTS[0]], [" thanks"]).mean.shape == (1,)


def test_score_output_conservative():
    out = ScoreOutput(torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.0]))
    assert out.conservative(2.0).tolist() == [0.0, 2.0]
    assert ScoreOutput(torch.tensor([1.0])).conservative(5.0).tolist() == [1.0]


@pytest.fixture(scope="module")
def small_rm(tiny_lm, task_data, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("score") / "rm"
    rm.train(
        rm_config(
            [
                "--model",
                tiny_lm,
                "--data",
                task_data["train"],
                "--output-dir",
                str(out),
                "--max-steps",
                "10",
                "--learning-rate",
                "3e-3",
                "--batch-size",
                "16",
            ]
        )
    )
    return str(out)


def test_score_command_keeps_rows_in_order_with_their_fields(small_rm, tmp_path, capsys):
    rows = []
    for i, r in enumerate(preference_rows(7, seed=3)):
        prompt = r["prompt"] if i % 2 else [{"role": "user", "content": r["prompt"]}]
        key = "response" if i % 3 else "completion"
        rows.append({"id": f"row-{i}", "prompt": prompt, key: r["chosen" if i % 2 else "rejected"], "meta": {"i": i}})
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "sub" / "scored.jsonl"
    assert (
        main(["score", "--reward-model", small_rm, "--data", str(data), "--output", str(output), "--batch-size", "3"])
        == 0
    )
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [{k: v for k, v in w.items() if k != "score"} for w in written] == rows
    assert all("score_std" not in w for w in written)
    scorer = RewardScorer.load(small_rm, "cpu")
    for row, w in zip(rows, written):  # each row scored alone gives the same number
        response = row.get("response", row.get("completion"))
        assert w["score"] == pytest.approx(float(scorer.score([row["prompt"]], [response]).mean[0]), abs=1e-5)
    assert len({round(w["score"], 6) for w in written}) == len(rows)


def test_a_cut_off_response_is_scored_without_the_eos_a_finished_one_gets(small_rm):
    scorer = RewardScorer.load(small_rm, "cpu")
    tokenizer, model = scorer.members[0].tokenizer, scorer.members[0].model
    prompts, responses = [SHORT[0], LONG[0]], [SHORT[1], LONG[1]]
    got = scorer.score(prompts, responses, finished=[True, False]).mean
    with torch.no_grad():
        for i, add_eos in enumerate([True, False]):
            enc = encode_pair(
                tokenizer, prompts[i], responses[i], scorer.max_length, scorer.max_prompt_length, add_eos=add_eos
            )
            assert (enc.response_ids[-1] == tokenizer.eos_token_id) == add_eos
            alone = sequence_scores(model, collate_pairs([enc], tokenizer.pad_token_id))
            assert float(got[i]) == pytest.approx(float(alone[0]), abs=1e-5)
    default = scorer.score(prompts, responses).mean  # no flags: every response complete (ends with EOS)
    assert float(default[0]) == pytest.approx(float(got[0]), abs=1e-5)
    assert abs(float(default[1]) - float(got[1])) > 1e-4


def test_score_command_names_a_bad_row(small_rm, tmp_path, capsys):
    data = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "a", "response": "b"}, {"prompt": "a"}])
    assert main(["score", "--reward-model", small_rm, "--data", str(data), "--output", str(tmp_path / "o.jsonl")]) == 1
    assert "in.jsonl: line 2" in capsys.readouterr().err
