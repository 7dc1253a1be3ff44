"""--output-dir: a folder holding another run is never written over by mistake; --overwrite-output-dir replaces
it and leaves nothing of the old run; an empty or unrelated folder is fine."""

from __future__ import annotations

import pytest

import rlhfkit
from rlhfkit.errors import UserError
from tests.helpers import metrics, run_cli, sft_args, sft_rows, write_jsonl


@pytest.fixture
def data(tmp_path):
    return write_jsonl(tmp_path / "sft.jsonl", sft_rows(16))


def test_a_folder_holding_a_run_stops_the_next_one_with_one_line(tiny_model_dir, data, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, out, max_steps=2))
    assert code == 0, err
    before = (out / "metrics.jsonl").read_text()
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, out, max_steps=3))
    assert code == 1
    assert err.strip() == (
        f"error: {out}: --output-dir holds another run (metrics.jsonl, config.yaml, model.safetensors); give "
        "--overwrite-output-dir to replace it, --resume to continue it, or another folder"
    )
    assert (out / "metrics.jsonl").read_text() == before  # untouched


def test_overwrite_replaces_the_run_and_nothing_stale_survives(tiny_model_dir, data, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli(capsys, *sft_args(tiny_model_dir, data, out, max_steps=4, save_steps=2))[0] == 0
    (out / "samples.jsonl").write_text("")  # another command's leftovers
    old_events = {p.relative_to(out) for p in (out / "tensorboard").rglob("*")}
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, out, max_steps=1, overwrite_output_dir="true"))
    assert code == 0, err
    assert [r["step"] for r in metrics(out)] == [1]
    assert not (out / "samples.jsonl").exists() and not (out / "checkpoints").exists()
    events = {p.relative_to(out) for p in (out / "tensorboard").rglob("*")}
    assert events and not events & old_events  # the tracker's files of this run only
    assert len([p for p in (out / "tensorboard").glob("events.out.tfevents.*")]) == 1
    assert (out / "model.safetensors").is_file()


def test_an_empty_or_unrelated_folder_is_fine(tiny_model_dir, data, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli(capsys, *sft_args(tiny_model_dir, data, empty, max_steps=1))[0] == 0
    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert run_cli(capsys, *sft_args(tiny_model_dir, data, other, max_steps=1))[0] == 0
    assert (other / "notes.txt").read_text() == "mine"


def test_resume_continues_and_the_api_keeps_its_in_memory_inputs(tiny_model_dir, tmp_path):
    out = tmp_path / "api"
    rows = sft_rows(16)
    common = dict(model=str(tiny_model_dir), output_dir=str(out), progress=False)
    common["data"] = rows
    rlhfkit.sft(**common, max_steps=2, save_steps=2)
    kept = (out / "inputs" / "data.jsonl").read_text()
    with pytest.raises(UserError, match="output_dir holds another run.*overwrite_output_dir=True"):
        rlhfkit.sft(**{**common, "data": sft_rows(16, seed=1)}, max_steps=2)  # other rows, refused
    assert (out / "inputs" / "data.jsonl").read_text() == kept  # the run's own inputs stay as they were
    rlhfkit.sft(**common, max_steps=4, resume=True)
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]
    # the rows given in memory are written to OUT/inputs/ first: replacing the run keeps them
    result = rlhfkit.sft(**common, max_steps=1, overwrite_output_dir=True)
    assert [r["step"] for r in metrics(result.output_dir)] == [1]
    assert (out / "inputs" / "data.jsonl").is_file() and not (out / "checkpoints").exists()
    with pytest.raises(UserError, match="resume=True continues .* overwrite_output_dir=True empties it first"):
        rlhfkit.sft(**common, max_steps=1, overwrite_output_dir=True, resume=True)
