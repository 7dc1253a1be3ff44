"""Several processes (two gloo processes on CPU) give the training of one, and runs stop and resume safely.

sft, rm and dpo on 2 processes x half the rows each vs 1 process with the same global --batch-size: the same
per-step losses and final weights; the same through two single-process "nodes" on 127.0.0.1. SIGTERM
checkpoints and stops; --resume then ends as the uninterrupted run. A damaged newest checkpoint falls back
to the one before it; a full disk leaves the previous checkpoint intact.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlhfkit.training import checkpoint as checkpoint_module
from tests.helpers import (
    launch,
    max_weight_diff,
    metrics,
    one_thread_env,
    pref_rows,
    run_cli,
    sft_args,
    sft_rows,
    update_apart,
    weights,
    write_jsonl,
)

STEPS = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dist_data")
    return {
        "sft": write_jsonl(root / "sft.jsonl", sft_rows(32, seed=3)),
        "prefs": write_jsonl(root / "prefs.jsonl", pref_rows(32, seed=4)),
    }


def command(name: str, model, data: dict, out: Path, *extra) -> list[str]:
    path = data["sft"] if name == "sft" else data["prefs"]
    args = [name, "--model", model, "--data", path, "--output-dir", out, "--batch-size", 8]
    args += ["--max-steps", STEPS, "--learning-rate", "3e-3", "--progress", "false", *extra]
    return [str(a) for a in args]


def assert_same_training(one: Path, two: Path, keys: tuple[str, ...], start: Path) -> None:
    """Same per-step metrics (1e-5), and final weights whose difference is float noise next to how far
    training moved them (``update_apart``)."""
    a, b = metrics(one), metrics(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        for key in keys:
            assert ra[key] == pytest.approx(rb[key], abs=1e-5, rel=1e-5), (ra["step"], key)
    diff, moved = update_apart(weights(one), weights(two), weights(start))
    assert moved > 1e-3 and diff < 1e-2 * moved, (diff, moved)


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("sft", ("loss", "grad_norm")),
        ("rm", ("loss", "accuracy", "grad_norm")),
        ("dpo", ("loss", "rewards/chosen", "rewards/rejected", "grad_norm")),
    ],
)
def test_two_processes_train_as_one(name, keys, tiny_model_dir, data, tmp_path, capsys):
    code, _, err = run_cli(capsys, *command(name, tiny_model_dir, data, tmp_path / "one"))
    assert code == 0, err
    two = tmp_path / "two"
    done = launch(command(name, tiny_model_dir, data, two, "--save-steps", 1))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_training(tmp_path / "one", two, keys, tiny_model_dir)
    if name == "sft":  # a checkpoint of two processes resumes with two, and one process stops at once
        code, _, err = run_cli(capsys, *command(name, tiny_model_dir, data, two, "--save-steps", 1, "--resume"))
        assert code == 1
        assert err.strip().splitlines()[-1] == (
            f"error: {two / 'checkpoints' / f'step-{STEPS}'}: written by 2 process(es); resume it with 2 (this run "
            "has 1): each process's sampling randomness is part of the checkpoint"
        )


def test_batch_size_must_split_over_processes(tiny_model_dir, data, tmp_path):
    done = launch(
        command("sft", tiny_model_dir, data, tmp_path / "odd", "--batch-size", 6, "--gradient-accumulation-steps", 2)
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [  # said once, not once per process
        "error: --batch-size 6 must be divisible by the number of processes (2) x --gradient-accumulation-steps (2)"
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.long  # the launcher's multi-node mode; rlhfkit runs as with one launcher (test above)
def test_two_nodes_on_one_machine_train_as_one_process(tiny_model_dir, data, tmp_path, capsys):
    """Two launchers, one process each, meeting at 127.0.0.1: the multi-node recipe."""
    code, _, err = run_cli(capsys, *command("sft", tiny_model_dir, data, tmp_path / "one"))
    assert code == 0, err
    port = free_port()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
            + ["--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]
            + ["-m", "rlhfkit", *command("sft", tiny_model_dir, data, tmp_path / "nodes")],
            env=one_thread_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    assert_same_training(tmp_path / "one", tmp_path / "nodes", ("loss", "grad_norm"), tiny_model_dir)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_sigterm_checkpoints_the_step_and_resume_ends_as_an_uninterrupted_run(tiny_model_dir, data, tmp_path, capsys):
    steps = ["--max-steps", 40, "--learning-rate", "1e-3"]
    code, _, err = run_cli(capsys, *command("sft", tiny_model_dir, data, tmp_path / "whole", *steps))
    assert code == 0, err

    out = tmp_path / "stopped"
    args = command("sft", tiny_model_dir, data, out, *steps, "--save-steps", 1000)  # no periodic checkpoint
    job = subprocess.Popen(
        [sys.executable, "-m", "rlhfkit", *args], env=one_thread_env(), stderr=subprocess.PIPE, text=True
    )
    log = out / "metrics.jsonl"
    wait_for(lambda: log.is_file() and log.read_text().count("\n") >= 3, 120, "three logged steps")
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGTERM
    message = err.strip().splitlines()[-1]
    assert message.startswith("stopped by SIGTERM after step ") and "--resume" in message
    step = int(message.split("after step ")[1].split()[0])
    assert 3 <= step < 40 and (out / "checkpoints" / f"step-{step}" / "meta.json").is_file()

    code, printed, err = run_cli(capsys, *args, "--resume")
    assert code == 0, err
    checkpoint = (out / "checkpoints" / f"step-{step}").resolve()
    assert f"resuming from {checkpoint} (step {step} of 40)" in err.splitlines()
    assert err.strip().splitlines()[-1] == f"model saved to {out.resolve()}"
    whole, resumed = metrics(tmp_path / "whole"), metrics(out)
    assert [r["step"] for r in resumed] == list(range(1, 41))
    for a, b in zip(whole, resumed):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6), a["step"]
    assert max_weight_diff(weights(tmp_path / "whole"), weights(out)) == 0.0


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tiny_model_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    args = command("sft", tiny_model_dir, data, out, "--save-steps", 1, "--save-total-limit", 3)
    assert run_cli(capsys, *args)[0] == 0
    newest = out / "checkpoints" / f"step-{STEPS}"
    model_file = newest / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:1000])  # cut short, as a full disk or a kill might

    code, _, err = run_cli(capsys, *args, "--resume")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: checkpoint {newest} is damaged (model.safetensors has 1000 bytes, expected "
        f"{(out / 'checkpoints' / 'step-2' / 'model.safetensors').stat().st_size}); trying the one before it"
    ]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]  # step 3 redone from step 2


def test_every_checkpoint_damaged_is_one_clear_error(tiny_model_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    args = command("sft", tiny_model_dir, data, out, "--save-steps", 1)
    assert run_cli(capsys, *args)[0] == 0
    for folder in (out / "checkpoints").glob("step-*"):
        (folder / "trainer_state.pt").unlink()
    code, _, err = run_cli(capsys, *args, "--resume")
    assert code == 1
    assert (
        err.strip().splitlines()[-1] == f"error: {out / 'checkpoints'}: --resume given but every checkpoint is damaged"
    )


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    saver = checkpoint_module.Checkpointer(tmp_path, limit=2)
    model = torch.nn.Linear(3, 2)
    saver.save(1, {"model": model}, {"stream": {"consumed": 4}})

    def no_space(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_module.torch, "save", no_space)
    with pytest.raises(checkpoint_module.UserError) as raised:
        saver.save(2, {"model": model}, {"stream": {"consumed": 8}})
    assert str(raised.value) == (
        f"{tmp_path / 'checkpoints'}: cannot write the checkpoint of step 2 (No space left on device); "
        f"the previous checkpoint {tmp_path / 'checkpoints' / 'step-1'} is intact"
    )
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]  # no half-written folder
    assert checkpoint_module.damage(saver.resume_point()) is None


def test_generate_score_and_eval_shard_rows_and_write_them_once_in_order(tiny_model_dir, data, tmp_path, capsys):
    rm_dir = tmp_path / "rm"
    assert run_cli(capsys, *command("rm", tiny_model_dir, data, rm_dir))[0] == 0
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl", [{"prompt": r["prompt"], "id": i} for i, r in enumerate(sft_rows(7))]
    )
    generated = tmp_path / "gen.jsonl"
    done = launch(
        ["generate", "--model", tiny_model_dir, "--data", prompts, "--output", generated, "--max-new-tokens", 6]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in generated.read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(7))  # 7 rows over 2 processes (4 + 3), input order

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert run_cli(capsys, "score", "--reward-model", rm_dir, "--data", generated, "--output", one)[0] == 0
    done = launch(["score", "--reward-model", rm_dir, "--data", generated, "--output", two])
    assert done.returncode == 0, done.stderr[-3000:]
    a = [json.loads(line) for line in one.read_text().splitlines()]
    b = [json.loads(line) for line in two.read_text().splitlines()]
    assert [r["id"] for r in b] == list(range(7))
    assert [r["score"] for r in a] == pytest.approx([r["score"] for r in b], abs=1e-5)

    report = tmp_path / "eval.json"
    args = ["eval", "--model", tiny_model_dir, "--data", prompts, "--output", report, "--reward-model", rm_dir]
    done = launch([*args, "--max-new-tokens", 6])
    assert done.returncode == 0, done.stderr[-3000:]
    metrics_ = json.loads(report.read_text())
    samples = [json.loads(line) for line in report.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert metrics_["n"] == 7 and [s["prompt"] for s in samples] == [r["prompt"] for r in rows]
    assert metrics_["reward/score"] == pytest.approx(sum(s["score"] for s in samples) / 7)


def test_more_gpu_processes_than_gpus_stop_with_the_fix_named(monkeypatch, capsys, tiny_model_dir, tmp_path):
    """NCCL refuses two ranks on one GPU with an error that does not say so: the run stops before the process
    group, naming the processes, the GPUs and the way out; on the CPU, or one process per GPU, nothing stops."""
    from rlhfkit.errors import UserError
    from rlhfkit.training.runtime import check_processes_per_gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"2 processes on this machine but 1 GPU: .*--nproc-per-node 1.*--cpu"):
        check_processes_per_gpu(cpu=False)
    check_processes_per_gpu(cpu=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_processes_per_gpu(cpu=False)
    # a training command reaches it before its process group is set up
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    data = write_jsonl(tmp_path / "sft.jsonl", sft_rows(8))
    code, _, err = run_cli(capsys, *sft_args(tiny_model_dir, data, tmp_path / "o", max_steps=1))
    assert code != 0 and "each process needs its own GPU" in err
