"""Every kind of bad input gets one line naming the file, the line/row and the field, and a non-zero exit."""

from __future__ import annotations

import json
import shutil

import pytest

from ..helpers import run_cli, sft_args, sft_rows, write_jsonl


def assert_one_line_error(code: int, err: str, *fragments: str) -> str:
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def good_rows(n: int = 4) -> list[dict]:
    return sft_rows(n, seed=1)


def sft_error(capsys, tiny_model_dir, tmp_path, data) -> tuple[int, str]:
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, tmp_path / "out", max_steps=1))
    assert not (tmp_path / "out" / "metrics.jsonl").exists(), "training started despite bad data"
    return code, err


def test_broken_json_names_file_and_line(capsys, tiny_model_dir, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good_rows(1)[0]) + "\n" + '{"prompt": "hi", "completion": }\n', encoding="utf-8")
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "line 2", "broken JSON")


def test_missing_field(capsys, tiny_model_dir, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", good_rows(2) + [{"completion": " alice wants the egg."}])
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "line 3", "field 'prompt'", "missing")


def test_mistyped_field(capsys, tiny_model_dir, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", good_rows(3) + [{"prompt": 5, "completion": " five"}])
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "line 4", "field 'prompt'", "got int")


def test_empty_string(capsys, tiny_model_dir, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Question: who?", "completion": "   "}] + good_rows(2))
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "line 1", "field 'completion'", "empty string")


def test_non_utf8_bytes(capsys, tiny_model_dir, tmp_path):
    path = tmp_path / "d.jsonl"
    good = "".join(json.dumps(r) + "\n" for r in good_rows(2)).encode()
    path.write_bytes(good + b'{"prompt": "caf\xe9", "completion": " ok"}\n')
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "line 3", "UTF-8")


def test_unknown_role(capsys, tiny_model_dir, tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "line 2", "field 'messages[1].role'", "unknown role 'robot'")


def test_wrong_kind_of_row_for_the_command(capsys, tiny_model_dir, tmp_path):
    rows = [{"prompt": "Question: who?", "chosen": " alice", "rejected": " bob"}]
    path = write_jsonl(tmp_path / "prefs.jsonl", rows)
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    line = assert_one_line_error(code, err, str(path), "line 1", "preference")
    assert "'completion'" in line and "'messages'" in line  # says what sft needs


def test_empty_file(capsys, tiny_model_dir, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "no rows")


def test_nonexistent_path(capsys, tiny_model_dir, tmp_path):
    path = tmp_path / "nowhere.jsonl"
    code, err = sft_error(capsys, tiny_model_dir, tmp_path, path)
    assert_one_line_error(code, err, str(path), "no such file")


def test_bad_eval_row_is_caught_before_training(capsys, tiny_model_dir, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", good_rows(8))
    bad_eval = write_jsonl(tmp_path / "eval.jsonl", good_rows(5) + [{"prompt": "Question: who?", "completion": ["x"]}])
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, train, tmp_path / "out", max_steps=1, eval_data=bad_eval))
    assert_one_line_error(code, err, str(bad_eval), "line 6", "completion[0]")
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_generate_rejects_bad_prompt_rows(capsys, tiny_model_dir, tmp_path):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Question: who?"}, {"question": "who?"}])
    code, _, err = run_cli(
        capsys, "generate", "--model", tiny_model_dir, "--data", path, "--output", tmp_path / "g.jsonl"
    )
    assert_one_line_error(code, err, str(path), "line 2", "'prompt'")
    assert not (tmp_path / "g.jsonl").exists()


def test_missing_model_directory(capsys, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", good_rows())
    code, _, err = run_cli(capsys, *sft_args(tmp_path / "no-model", data, tmp_path / "out"))
    assert_one_line_error(code, err, str(tmp_path / "no-model"), "does not exist")


def test_directory_that_is_not_a_model(capsys, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", good_rows())
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    code, _, err = run_cli(capsys, *sft_args(tmp_path / "junk", data, tmp_path / "out"))
    assert_one_line_error(code, err, str(tmp_path / "junk"), "config.json")


def test_pickled_bin_only_model_is_refused(capsys, tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", good_rows())
    bin_dir = tmp_path / "bin-model"
    shutil.copytree(tiny_model_dir, bin_dir)
    for f in bin_dir.glob("*.safetensors"):
        f.unlink()
    (bin_dir / "pytorch_model.bin").write_bytes(b"not loaded")
    code, _, err = run_cli(capsys, *sft_args(bin_dir, data, tmp_path / "out"))
    assert_one_line_error(code, err, str(bin_dir), "safetensors", "pytorch_model.bin")


def test_debug_flag_shows_the_traceback(capsys, tiny_model_dir, tmp_path):
    path = tmp_path / "nowhere.jsonl"
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, path, tmp_path / "out"), "--debug")
    assert code != 0
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize(
    "flag,value,fragment",
    [
        ("--learning-rate", "fast", "--learning-rate must be a number"),
        ("--batch-size", "0", "--batch-size must be > 0"),
        ("--lr-scheduler", "step", "must be one of linear, cosine, constant"),
    ],
)
def test_invalid_flag_value(capsys, tiny_model_dir, tmp_path, flag, value, fragment):
    data = write_jsonl(tmp_path / "d.jsonl", good_rows())
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, tmp_path / "out"), flag, value)
    assert_one_line_error(code, err, fragment)
