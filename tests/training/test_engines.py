"""FSDP2 through accelerate's plugin (examples/accelerate/fsdp2.yaml), on two CPU processes: the same
training as data parallel, sharded checkpoints that resume, a final model plain transformers loads; and a
job stopped by SIGTERM on two processes resumes to the uninterrupted result."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers import launch, one_thread_env, sft_rows, update_apart, write_jsonl

FSDP2 = Path(__file__).parents[2] / "examples" / "accelerate" / "fsdp2.yaml"


def accelerate_launch(config: Path, args: list, timeout: float = 300, **popen):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    cmd += ["--num_processes", "2", "--mixed_precision", "no", "-m", "rlhfkit", *map(str, args)]
    if popen:
        return subprocess.Popen(cmd, env=one_thread_env(), **popen)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=one_thread_env())


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("engines") / "sft.jsonl", sft_rows(32, seed=3))


def sft(model, data, out, *extra) -> list:
    args = ["sft", "--model", model, "--data", data, "--output-dir", out, "--batch-size", 8, "--max-steps", 4]
    return args + ["--learning-rate", "1e-3", "--progress", "false", "--save-steps", 2, *extra]


def test_fsdp2_trains_as_data_parallel_and_resumes_from_sharded_checkpoints(tiny_model_dir, sft_data, tmp_path):
    ddp = launch(sft(tiny_model_dir, sft_data, tmp_path / "ddp"))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    fsdp = accelerate_launch(FSDP2, sft(tiny_model_dir, sft_data, tmp_path / "fsdp"))
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    for a, b in zip(rows(tmp_path / "ddp"), rows(tmp_path / "fsdp"), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5) and a["grad_norm"] == pytest.approx(
            b["grad_norm"], rel=1e-4
        )
    step = tmp_path / "fsdp" / "checkpoints" / "step-4"
    shards = sorted(p.name for p in (step / "shards").iterdir())
    assert sum(name.endswith(".distcp") for name in shards) == 2  # one shard file per process
    meta = json.loads((step / "meta.json").read_text())
    assert meta["world_size"] == 2 and {"rank-0.pt", "rank-1.pt"} <= set(meta["files"])

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp")  # one gathered Hugging Face directory
    a, b = load_file(tmp_path / "ddp" / "model.safetensors"), model.state_dict()
    apart, moved = update_apart(a, {k: b[k] for k in a}, load_file(tiny_model_dir / "model.safetensors"))
    assert moved > 1e-3 and apart < 1e-2 * moved, (apart, moved)

    # resume: drop the last checkpoint and the final model, continue from the sharded step-2 checkpoint
    import shutil

    shutil.rmtree(step)
    (tmp_path / "fsdp" / "model.safetensors").unlink()
    again = accelerate_launch(FSDP2, sft(tiny_model_dir, sft_data, tmp_path / "fsdp", "--resume"))
    assert again.returncode == 0, again.stderr[-3000:]
    for a, b in zip(rows(tmp_path / "ddp"), rows(tmp_path / "fsdp"), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5), a["step"]


def test_sigterm_on_two_processes_checkpoints_the_same_step_and_resumes(tiny_model_dir, sft_data, tmp_path):
    """The launcher passes SIGTERM to both processes; they agree on the step, checkpoint it, say so once, and
    --resume finishes the run. (That a resumed run equals an uninterrupted one is checked on one process in
    test_distributed.py and after a kill of a 2-process job in test_distributed_online.py.)"""
    from tests.helpers import launcher

    args = sft(tiny_model_dir, sft_data, tmp_path / "run", "--max-steps", 120, "--save-steps", 1000)
    job = subprocess.Popen(
        launcher(2) + ["-m", "rlhfkit", *map(str, args)], env=one_thread_env(), stderr=subprocess.PIPE, text=True
    )
    log = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (log.is_file() and log.read_text().count("\n") >= 5) and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)  # to the launcher, which passes it to both processes
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0
    stopped = [line for line in err.splitlines() if line.startswith("stopped by")]
    assert len(stopped) == 1 and "--resume" in stopped[0], err[-2000:]
    step = int(stopped[0].split("after step ")[1].split()[0])
    checkpoint = tmp_path / "run" / "checkpoints" / f"step-{step}"
    assert step < 120 and json.loads((checkpoint / "meta.json").read_text())["world_size"] == 2

    resumed = launch([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in rows(tmp_path / "run")] == list(range(1, 121))


def test_fsdp2_ppo_with_lora_matches_data_parallel(tiny_model_dir, sft_data, tmp_path):
    """LoRA under FSDP2: the adapters start the same on every process, the reference (adapters off) and the
    sampling run on gathered parameters, and the final model is merged from the gathered weights."""
    prompts = write_jsonl(
        tmp_path / "p.jsonl", [{"prompt": f"Question: what does {n} want? Answer:"} for n in "abcdefgh"]
    )
    reward = tmp_path / "r.py"
    reward.write_text("def short(prompts, completions, **kwargs):\n    return [-len(c) / 20 for c in completions]\n")
    args = ["ppo", "--model", tiny_model_dir, "--data", prompts, "--reward-fn", f"{reward}:short", "--lora-r", 8]
    args += ["--batch-size", 8, "--max-new-tokens", 8, "--max-steps", 3, "--learning-rate", "1e-3"]
    args += ["--progress", "false", "--output-dir"]
    ddp = launch([*args, tmp_path / "ddp"])
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    fsdp = accelerate_launch(FSDP2, [*args, tmp_path / "fsdp"])
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    for a, b in zip(rows(tmp_path / "ddp"), rows(tmp_path / "fsdp"), strict=True):
        for key in ("reward/score", "kl/ref", "loss/policy", "loss/value"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key)
    merged, gathered = (
        load_file(tmp_path / "ddp" / "model.safetensors"),
        load_file(tmp_path / "fsdp" / "model.safetensors"),
    )
    assert max(float((merged[k] - gathered[k]).abs().max()) for k in merged) < 1e-5
