"""--resume ends exactly where an uninterrupted run ends; a kill during a save never leaves a usable-looking
checkpoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlhfkit
from rlhfkit.training import checkpoint as ckpt_module
from rlhfkit.training.checkpoint import Checkpointer

from ..helpers import max_weight_diff, metrics, run_cli, sft_args, sft_rows, weights, write_jsonl


def test_resumed_sft_in_a_fresh_process_matches_the_uninterrupted_run(tiny_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(20, seed=7))  # 20 rows / 4 per step: crosses epochs
    out = tmp_path / "out"
    args = sft_args(
        tiny_model_dir,
        data,
        out,
        max_steps=8,
        batch_size=4,
        learning_rate=3e-3,
        warmup_steps=2,
        save_steps=2,
        save_total_limit=4,
        weight_decay=0.1,
    )

    # 1. The uninterrupted run (it writes checkpoints at steps 2, 4, 6 and 8 on the way).
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    full_weights, full_metrics = weights(out), metrics(out)
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-2", "step-4", "step-6", "step-8"]

    # 2. Make the folder look like a run killed at step 5, while it was writing the step-4 checkpoint's
    #    successor: later checkpoints and the final model are gone, and a half-written .tmp folder is left.
    for name in ("step-4", "step-6", "step-8"):
        shutil.rmtree(ckpts / name)
    for f in out.glob("*.safetensors"):
        f.unlink()
    tmp = ckpts / ".tmp-step-4"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"\x00" * 100)  # truncated weights, no meta.json
    (ckpts / "step-7").mkdir()  # a folder without meta.json is not a complete checkpoint either
    with (out / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 9, "lo')  # a metrics line cut short by the kill

    # 3. A fresh process resumes from step 2 (the newest complete checkpoint) and runs to the end.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # same float reduction order
    proc = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli.main", *args, "--resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr

    assert max_weight_diff(weights(out), full_weights) <= 1e-6  # bitwise equal on one machine
    resumed = metrics(out)
    assert [r["step"] for r in resumed] == list(range(1, 9))  # reads as one uninterrupted run
    for a, b in zip(resumed, full_metrics):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["learning_rate"] == pytest.approx(b["learning_rate"], rel=1e-12)


def test_resume_without_a_checkpoint_is_a_clear_error(tiny_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(8))
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, tmp_path / "out", max_steps=2), "--resume")
    assert code != 0 and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"error: {tmp_path / 'out' / 'checkpoints'}: --resume given but there is no complete checkpoint"
    ]


class Interrupted(Exception):
    pass


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_as_the_latest(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    saver = Checkpointer(tmp_path, limit=2)
    saver.save(1, {"model": model}, {"stream": {"consumed": 4}})
    before = {k: v.clone() for k, v in model.state_dict().items()}

    with torch.no_grad():
        model.weight.add_(1.0)

    def killed(*_args, **_kwargs):  # the model file is written, then the process dies in torch.save
        raise Interrupted

    monkeypatch.setattr(ckpt_module.torch, "save", killed)
    with pytest.raises(Interrupted):
        saver.save(2, {"model": model}, {"stream": {"consumed": 8}})
    monkeypatch.undo()

    assert (tmp_path / "checkpoints" / ".tmp-step-2" / "model.safetensors").is_file()
    assert not (tmp_path / "checkpoints" / "step-2").exists()
    assert saver.latest() == tmp_path / "checkpoints" / "step-1"
    step, state = saver.load(saver.resume_point(), {"model": model})
    assert step == 1 and state["stream"] == {"consumed": 4}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())

    # the next save of that step replaces the leftover; old checkpoints beyond the limit are pruned
    for s in (2, 3):
        saver.save(s, {"model": model}, {"stream": {"consumed": 4 * s}})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-2", "step-3"]


def test_checkpoint_refuses_non_finite_weights(tmp_path):
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError):
        Checkpointer(tmp_path).save(1, {"model": model}, {})
    assert not any(Path(tmp_path, "checkpoints").glob("step-*"))


def test_a_lora_runs_checkpoint_holds_what_trains_and_resumes_to_the_same_adapter(tiny_model_dir, tmp_path):
    """A LoRA run's checkpoint leaves the frozen backbone out (the resumed run rebuilds it from --model) and
    resumes to the adapter the uninterrupted run ends with."""
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(20, seed=7))
    common = dict(
        model=str(tiny_model_dir), data=str(data), max_steps=6, batch_size=4, learning_rate=1e-2, lora_r=4,
        save_steps=3, save_total_limit=2, save_merged=False, progress=False,
    )  # fmt: skip
    rlhfkit.sft(**common, output_dir=str(tmp_path / "full"))
    saved = load_file(tmp_path / "full" / "checkpoints" / "step-3" / "model.safetensors")
    assert saved and all(".lora_" in k for k in saved)  # the adapters alone (the backbone is frozen)
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step-6")
    (tmp_path / "cut" / "adapter_model.safetensors").unlink()
    rlhfkit.sft(**common, output_dir=str(tmp_path / "cut"), resume=True)
    a = load_file(tmp_path / "full" / "adapter_model.safetensors")
    b = load_file(tmp_path / "cut" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
