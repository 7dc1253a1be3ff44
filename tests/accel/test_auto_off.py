"""``--accel auto`` trains as ``--accel off`` does, up to float rounding: sft, rm, dpo, ppo and grpo on a tiny
Llama (SwiGLU, so the kernel swap applies), with the vocabulary blocks made small so the block-wise
log-probs run, and on the CPU oneDNN's linear layers forced on and batches of varied lengths so packing runs.
Each pair of runs is compared step by step (the logged metrics) and by the final weights (``update_apart``).

The same tests run on a GPU with ``RLHFKIT_TEST_GPU=1`` (``bench/gpu_check.sh``), in fp32 with TF32 off; there
``auto`` pads (no packing) and keeps the kernel swaps, the lean decode step and the block-wise log-probs."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

import rlhfkit
from rlhfkit.accel import choices, decode, packing, vocab
from tests.helpers import metrics, pref_rows, sft_rows, update_apart, weights, write_jsonl

from ..trainers.online.test_ppo_resume import make_reward_model

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason="no CUDA device (RLHFKIT_TEST_GPU=1 on a machine with one)"
        ),
    ),
]
COMMANDS = ["sft", "rm", "dpo", "ppo", "grpo"]
# The weights of the two runs may be this far apart, as a fraction of how far training moved them: float
# reordering (packed rows, fused kernels, block-wise sums) changes the last bits of each step's numbers, and
# Adam's first steps (about lr * sign(g)) turn that into at most a small part of the move.
APART = 1e-2
# A logged metric of the two runs may differ by this much, relative to its size (absolute below 1): the
# metrics of later steps follow weights that differ by up to APART of the move.
METRIC_TOL = 2e-2
NOT_COMPARED = ("time/", "memory/", "perf/", "throughput/", "speed/", "lr", "step", "epoch")
# Counted fractions (tokens past a clip threshold, pairs ranked right) flip where a number sits on the threshold:
# at DPO's first step the policy is the reference, so each pair's reward margin is 0 up to rounding and its
# accuracy is the sign of that rounding. These may differ by two rows' share of a batch of 8.
COUNTED = ("clipfrac", "accuracy")
COUNTED_TOL = 0.25


def length_reward(prompts, completions, **columns):
    """Highest for completions of 20 characters: varies within a group, a known function of the text."""
    return [-abs(len(c) - 20) / 10 for c in completions]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, tiny_corpus):
    from rlhfkit.config.commands import InitModelConfig
    from rlhfkit.models.init_model import init_model

    out = tmp_path_factory.mktemp("tiny_llama")
    init_model(InitModelConfig(output_dir=str(out), corpus=str(tiny_corpus), arch="llama", size="tiny", seed=0))
    return out


@pytest.fixture(scope="module")
def reward_model(tiny_llama, tmp_path_factory):
    return make_reward_model(tiny_llama, tmp_path_factory.mktemp("rm"))


@pytest.fixture
def used(monkeypatch, tiny_llama):
    """Counts of the accelerated paths taken; the vocabulary blocks small enough for the tiny model's logits and,
    on the CPU, every linear layer through oneDNN where oneDNN works here."""
    from rlhfkit.accel import onednn

    seen: Counter = Counter()

    def spy(owner, name, key):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            seen[key] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)

    spy(vocab, "head_logprobs", "vocab_blocks")
    spy(vocab, "chunked_logprobs", "vocab_blocks")
    spy(packing.PackedBatch, "run", "packing")
    spy(decode.LeanDecoder, "step", "lean_decode")
    prepare = rlhfkit.accel.prepare_model

    def prepare_model(model):
        swapped = prepare(model)
        seen.update(name for name, count in swapped.items() if count)
        return swapped

    monkeypatch.setattr(rlhfkit.accel, "prepare_model", prepare_model)
    vocab_size = weights(tiny_llama)["model.embed_tokens.weight"].shape[0]
    monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", 3 * vocab_size)  # 3 positions a block
    monkeypatch.setattr(onednn, "ONEDNN_MIN_MACS", 1)
    monkeypatch.setattr(onednn, "onednn_faster", lambda in_features, out_features, backward=False: True)
    return seen


def run(command: str, mode: str, device: str, model, reward_model, tmp_path):
    """One tiny training run of ``command`` under ``--accel mode``; its output directory."""
    out = tmp_path / f"{command}-{mode}"
    common = dict(
        model=str(model),
        output_dir=str(out),
        accel=mode,
        cpu=device == "cpu",
        mixed_precision="no",
        max_steps=3,
        batch_size=8,
        learning_rate=1e-3,
        progress=False,
        seed=3,
    )
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    if command == "sft":
        rlhfkit.sft(data=str(write_jsonl(data / "sft.jsonl", sft_rows(24))), **common)
    elif command in ("rm", "dpo"):
        getattr(rlhfkit, command)(data=str(write_jsonl(data / "prefs.jsonl", pref_rows(24))), **common)
    else:
        prompts = write_jsonl(data / "prompts.jsonl", [{"prompt": r["prompt"]} for r in sft_rows(24)])
        if command == "ppo":
            rewards = dict(reward_model=str(reward_model), value_model=str(reward_model))
        else:
            rewards = dict(reward_fns=[length_reward], num_generations=4)
        getattr(rlhfkit, command)(data=str(prompts), max_new_tokens=8, **rewards, **common)
    return out


def compared(row: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith(NOT_COMPARED)
    }


def metric_gap(a: list[dict], b: list[dict]) -> tuple[float, str]:
    """The largest difference of a logged metric between two runs' rows, relative to its size (a counted fraction's
    scaled to METRIC_TOL / COUNTED_TOL), and its name."""
    assert [r.get("step") for r in a] == [r.get("step") for r in b]
    worst, name = 0.0, ""
    for row_a, row_b in zip(a, b):
        ma, mb = compared(row_a), compared(row_b)
        assert ma.keys() == mb.keys()
        for k in ma:
            if math.isnan(ma[k]) and math.isnan(mb[k]):
                continue
            gap = abs(ma[k] - mb[k]) / max(1.0, abs(ma[k]))
            if k.endswith(COUNTED):
                gap *= METRIC_TOL / COUNTED_TOL
            if gap > worst:
                worst, name = gap, f"step {row_a.get('step')} {k}"
    return worst, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("command", COMMANDS)
def test_auto_trains_as_off_does(command, device, tiny_llama, reward_model, used, tmp_path, monkeypatch):
    if device == "cuda":  # fp32 products as the CPU's: no TF32
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    auto = run(command, "auto", device, tiny_llama, reward_model, tmp_path)
    taken = dict(used)
    used.clear()
    off = run(command, "off", device, tiny_llama, reward_model, tmp_path)
    assert not used, f"--accel off took accelerated paths: {dict(used)}"

    # auto took the paths that apply on this device
    on = choices(device)
    expected = {"swiglu_mlp"} | ({"vocab_blocks"} if command != "rm" else set())  # (a reward model has no LM head)
    expected |= {"lean_decode"} if command in ("ppo", "grpo") else set()
    if on.packing:
        expected |= {"packing"}
    assert expected <= taken.keys(), f"auto on {device} took {taken}"
    assert ("packing" in taken) == on.packing

    gap, where = metric_gap(metrics(auto), metrics(off))
    start = weights(tiny_llama)
    apart, moved = update_apart(weights(auto), weights(off), start)
    print(
        f"{command} on {device}: apart / moved = {apart / moved:.2e}, largest metric gap {gap:.2e} ({where}), {taken}"
    )
    assert moved > 0
    assert apart < APART * moved
    assert gap < METRIC_TOL, where
