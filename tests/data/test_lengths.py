"""Lengths said, never cut silently: prompts longer than --max-prompt-length stop a run unless
--truncate-prompts (then a note counts them), training rows cut to fit --max-length are counted, and a
sequence longer than the model's positions stops the run with one line before any weights load."""

from __future__ import annotations

import json
import logging

import pytest

import rlhfkit
from rlhfkit.data.encode import IGNORE_INDEX, prompt_token_ids
from rlhfkit.data.lengths import check_generation_fits, encode_prompts
from rlhfkit.errors import UserError
from rlhfkit.models import loading

from ..helpers import run_cli, write_jsonl
from ..multiturn.scripted import TOOLS

WORDS = "alice wants the apple today and bob wants the book "


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return loading.load_tokenizer(str(tiny_model_dir))


@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(loading, "load_pretrained", refuse)


def prompts_of(sizes: list[int]) -> list[str]:
    """Prompts of the given numbers of words."""
    words = ("Question: " + WORDS * 40).split()
    return [" ".join(words[:n]) for n in sizes]


def test_long_prompts_stop_unless_truncation_is_asked_for_and_then_are_counted(tok, caplog):
    prompts = prompts_of([3, 30, 60, 4])
    lengths = [len(prompt_token_ids(tok, p)) for p in prompts]
    assert lengths[0] < 16 < lengths[1] < lengths[2] and lengths[3] < 16
    with pytest.raises(UserError) as raised:
        encode_prompts(tok, prompts, 16, False, "prompts.jsonl")
    assert str(raised.value) == (
        f"prompts.jsonl: 2 of 4 prompts are longer than --max-prompt-length 16 tokens (the longest: row 3, "
        f"{lengths[2]} tokens): raise --max-prompt-length, or give --truncate-prompts to keep the last 16 tokens "
        "of each"
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        ids = encode_prompts(tok, prompts, 16, True, "prompts.jsonl")
    assert [len(i) for i in ids] == [lengths[0], 16, 16, lengths[3]]
    assert ids[2] == prompt_token_ids(tok, prompts[2])[-16:]  # the end is what the response follows
    assert caplog.messages == [
        f"note: prompts.jsonl: 2 of 4 prompts are longer than --max-prompt-length 16 tokens (the longest: row 3, "
        f"{lengths[2]} tokens); each keeps its last 16 (--truncate-prompts)"
    ]
    assert encode_prompts(tok, prompts, 1000, False, "prompts.jsonl")[2] == prompt_token_ids(tok, prompts[2])


@pytest.mark.parametrize("command", ["grpo", "generate"])
def test_a_long_prompt_stops_the_command_before_any_weights_load(tiny_model_dir, tmp_path, capsys, no_weights, command):
    data = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": p} for p in prompts_of([3, 3, 60, 3])])
    args = {
        "grpo": ["--output-dir", tmp_path / "out", "--reward-fn", "arithmetic", "--num-generations", 2],
        "generate": ["--output", tmp_path / "out.jsonl"],
    }[command]
    code, _, err = run_cli(
        capsys, command, "--model", tiny_model_dir, "--data", data, "--max-prompt-length", 16, "--batch-size", 4, *args
    )
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"error: {data}: 1 of 4 prompts are longer than --max-prompt-length 16 tokens (the longest: row 3"
    )


def test_truncate_prompts_lets_the_command_run_on_the_prompts_last_tokens(tiny_model_dir, tmp_path, capsys):
    prompts = prompts_of([3, 60])
    data = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": p} for p in prompts])
    out = tmp_path / "out.jsonl"
    code, _, err = run_cli(
        capsys, "generate", "--model", tiny_model_dir, "--data", data, "--output", out, "--max-prompt-length", 16,
        "--max-new-tokens", 4, "--truncate-prompts",
    )  # fmt: skip
    assert code == 0, err
    assert f"note: {data}: 1 of 2 prompts are longer than --max-prompt-length 16 tokens (the longest: row 2" in err
    assert [json.loads(line)["prompt"] for line in out.read_text().splitlines()] == prompts


def test_a_prompt_and_its_new_tokens_past_the_models_positions_stop_the_run(
    tiny_model_dir, tmp_path, capsys, no_weights
):
    data = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Q: {i}+1=\nA:"} for i in range(4)])
    code, _, err = run_cli(
        capsys, "grpo", "--model", tiny_model_dir, "--data", data, "--output-dir", tmp_path / "out",
        "--reward-fn", "arithmetic", "--num-generations", 2, "--batch-size", 4, "--max-new-tokens", 300,
    )  # fmt: skip
    assert code == 1 and len(err.splitlines()) == 1, err
    longest = max(
        len(prompt_token_ids(loading.load_tokenizer(str(tiny_model_dir)), f"Q: {i}+1=\nA:")) for i in range(4)
    )
    assert err.strip() == (
        f"error: {tiny_model_dir}: the model reads at most 256 positions (n_positions in config.json), fewer than "
        f"a prompt of {longest} tokens + --max-new-tokens 300: lower --max-prompt-length (with --truncate-prompts) "
        "or --max-new-tokens"
    )
    (tmp_path / "tools.py").write_text(TOOLS)
    with pytest.raises(UserError, match=r"at most 256 positions .*, fewer than max_total_tokens=1000: lower it"):
        rlhfkit.grpo(
            model=str(tiny_model_dir), data=str(data), output_dir=tmp_path / "mt", reward_fns=["tools"],
            tools=[f"{tmp_path}/tools.py:add"], max_total_tokens=1000, num_generations=2, batch_size=4,
        )  # fmt: skip


def test_a_model_without_a_position_limit_is_not_checked(tiny_model_dir, tmp_path):
    folder = tmp_path / "no-limit"
    folder.mkdir()
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.pop("n_positions")
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    assert loading.position_limit(str(folder)) is None
    check_generation_fits(
        str(folder), loading.position_limit(str(folder)), [[1] * 10_000], 10_000
    )  # nothing to check against
    assert loading.position_limit(str(tiny_model_dir)) == (256, "n_positions")


def test_sft_counts_the_rows_it_cuts_and_names_a_row_with_no_completion_left(tiny_model_dir, tmp_path, caplog):
    from rlhfkit.config.parts import DataArgs
    from rlhfkit.data.schema import SFTExample
    from rlhfkit.trainers.sft import encode_all

    tok = loading.load_tokenizer(str(tiny_model_dir))
    long = " ".join((WORDS * 10).split()[:50])
    rows = [
        SFTExample(prompt="Question: hi? Answer:", completion=" hello"),
        SFTExample(prompt="Question: hi? Answer:", completion=" " + long),
        SFTExample(prompt="Question: " + long + " Answer:", completion=" ok"),
    ]
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        items = encode_all(tok, rows, DataArgs(max_length=32, max_prompt_length=20), "sft.jsonl", str(tiny_model_dir))
    assert len(items[1][0]) == 32  # the completion's end cut
    assert sum(label == IGNORE_INDEX for label in items[2][1]) == 20  # the prompt's start cut
    full = len(prompt_token_ids(tok, rows[1].prompt)) + len(tok(" " + long)["input_ids"]) + 1  # + EOS
    assert caplog.messages == [
        f"note: sft.jsonl: 2 of 3 rows do not fit --max-length 32 / --max-prompt-length 20 (the longest: row 2, "
        f"{full} tokens); they are cut: the response's end first, then the prompt's start"
    ]
    conversation = [{"role": "user", "content": long}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(UserError, match=r"sft.jsonl: row 1: \d+ tokens, no completion tokens left after truncation to "
                       r"--max-length 16"):  # fmt: skip
        encode_all(tok, [SFTExample(messages=conversation)], DataArgs(max_length=16), "sft.jsonl")


def test_training_rows_longer_than_the_models_positions_stop_sft_dpo_and_rm(
    tiny_model_dir, tmp_path, capsys, no_weights
):
    long = " ".join((WORDS * 30).split()[:260])
    sft = write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": "Q:", "completion": " hi"}, {"prompt": "Q:", "completion": " " + long}]
    )
    prefs = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": "Q:", "chosen": " hi", "rejected": " " + long}] * 2)
    for command, data in (("sft", sft), ("dpo", prefs), ("rm", prefs)):
        code, _, err = run_cli(
            capsys, command, "--model", tiny_model_dir, "--data", data, "--output-dir", tmp_path / command,
            "--max-length", 600, "--progress", "false",
        )  # fmt: skip
        assert code == 1, err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"error: {data}: row ") and "more than the 256 positions the model reads" in line, err
        assert line.endswith(f"(n_positions in {tiny_model_dir}/config.json): lower --max-length to 256")
