"""A reference that follows the policy (--ref-update-steps, --ref-ema) takes each step's update at the start of the
next step (step 0 of ``OnlineTrainer.step``): what runs between two steps measures the policy against the reference
that step trained with, and a checkpoint records whether its reference has taken its step's update yet."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit import ops
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.trainers.online import train
from rlhfkit.training.checkpoint import META_FILE, STATE_FILE, load_weights, save_weights, sha256

from .conftest import ThanksScorer, parse, read_metrics

BASE = (
    "--reward-model none --batch-size 8 --max-new-tokens 6 --progress false --normalize-reward false "
    "--learning-rate 1e-3 --max-steps 4 --seed 3"
)


def run(model, prompts, out, flags: str) -> list[dict]:
    train(parse("ppo", f"--model {model} --data {prompts} --output-dir {out} {BASE} {flags}"), scorer=ThanksScorer())
    return read_metrics(out)


def test_the_held_out_kl_is_to_the_reference_the_step_trained_against(thanks_task, tmp_path):
    model, prompts = thanks_task
    rows = run(model, prompts, tmp_path, f"--ref-update-steps 1 --eval-data {prompts} --eval-steps 1")
    # each step samples from a copy of the policy the step before left ...
    assert [r["kl/ref"] for r in rows] == [0.0] * 4
    # ... and the evaluation after it sees the policy one update away from that reference (a copy taken right
    # after the update would make these 0)
    assert all(abs(r["eval/kl/ref"]) > 1e-6 for r in rows), [r["eval/kl/ref"] for r in rows]


def test_a_checkpoint_whose_reference_has_taken_its_steps_update_resumes_as_well(thanks_task, tmp_path):
    """A checkpoint without the flag (one written with the EMA applied at the end of its step) resumes to the
    uninterrupted run's KL values, as one with the flag does."""
    model, prompts = thanks_task
    full = run(model, prompts, tmp_path / "full", "--ref-ema 0.5 --save-steps 2")
    step2 = tmp_path / "cut" / "checkpoints" / "step-2"
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-2", step2)
    shutil.copy(tmp_path / "full" / "metrics.jsonl", tmp_path / "cut" / "metrics.jsonl")
    state = torch.load(step2 / STATE_FILE, weights_only=True)
    assert state.pop("reference_behind") is True
    # the reference as it is once it has taken step 2's update, and no flag
    reference, policy = load_causal_lm(str(model)), load_causal_lm(str(model))
    load_weights(reference, step2 / "reference.safetensors")
    weights = load_file(str(step2 / "actor_critic.safetensors"))
    mine = {k.removeprefix("policy."): v for k, v in weights.items() if k.startswith("policy.")}
    missing, unexpected = policy.load_state_dict(mine, strict=False)
    assert not unexpected and set(missing) <= {"transformer.wte.weight"}  # tied to lm_head, which the file has
    ops.ema_update(reference, policy, 0.5)
    save_weights(reference, step2 / "reference.safetensors")
    torch.save(state, step2 / STATE_FILE)
    meta = json.loads((step2 / META_FILE).read_text())
    for name in ("reference.safetensors", STATE_FILE):
        meta["files"][name] = {"bytes": (step2 / name).stat().st_size, "sha256": sha256(step2 / name)}
    (step2 / META_FILE).write_text(json.dumps(meta))
    resumed = run(model, prompts, tmp_path / "cut", "--ref-ema 0.5 --save-steps 2 --resume")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(full[2:], resumed[2:]):
        assert a["kl/ref"] == pytest.approx(b["kl/ref"], abs=1e-6, rel=1e-5), a["step"]
