"""What keeps `rlhfkit iterate` working where nobody tuned it: the reward model's updates continue at the settings
it was trained with, a collapsed policy is detected and its round still gets pairs that differ, and online DPO
(--algorithm dpo) learns from the same judge as the control."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

import rlhfkit
from rlhfkit.config.commands import RMConfig
from rlhfkit.config.iterate import IterateArgs
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.iterated.health import collapsed, distinct_share, similar_share, similarity
from rlhfkit.iterated.models import sample_pairs
from rlhfkit.iterated.reward_models import split_heldout
from tests.helpers import read_jsonl

from .conftest import SMALL, thanks_share


def _moved(before: Path, after: Path) -> float:
    """Largest absolute change of any weight between two reward-model folders."""
    a, b = load_file(str(before / "model.safetensors")), load_file(str(after / "model.safetensors"))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_a_reward_model_continues_at_the_rate_and_batch_size_it_was_trained_at(iterate_task, tmp_path):
    # The reward model is trained at 1e-3 and 4 pairs a step, neither `rlhfkit rm`'s default (its config.yaml says
    # so); iterate's default --rm-learning-rate and --rm-batch-size read them back, where a fixed default rate would
    # leave the model where it was.
    t = iterate_task
    default = RMConfig().optim
    rate, batch = SMALL["rm_learning_rate"], default.batch_size // 2
    assert rate != default.learning_rate and batch != default.batch_size
    rm = tmp_path / "rm"
    rlhfkit.rm(
        model=t["sft"], data=t["prefs"], output_dir=str(rm), max_steps=4, learning_rate=rate, batch_size=batch,
        progress=False,
    )  # fmt: skip
    saved = yaml.safe_load((rm / "config.yaml").read_text())
    assert (saved["learning_rate"], saved["batch_size"]) == (rate, batch)
    assert IterateArgs().rm_learning_rate == 0 and IterateArgs().rm_batch_size == 0
    flags = {**SMALL, "pairs_per_round": 16, "max_steps": 1, "rm_steps": 10}
    del flags["rm_learning_rate"]
    moved = {}
    for name, extra in {"default": {}, "small": {"rm_learning_rate": 2e-5}}.items():
        out = tmp_path / name
        rlhfkit.iterate(
            model=t["sft"], reward_model=str(rm), data=t["prompts"], output_dir=str(out), judge=t["judge"],
            rounds=1, **flags, **extra,
        )  # fmt: skip
        updated = yaml.safe_load((out / "round-1" / "rm" / "config.yaml").read_text())
        assert updated["learning_rate"] == extra.get("rm_learning_rate", rate)
        assert updated["batch_size"] == batch  # the batch size it was trained with
        moved[name] = _moved(rm, out / "round-1" / "rm")
    assert moved["default"] > 10 * moved["small"], moved


def test_an_update_that_leaves_held_out_accuracy_unmoved_says_so(two_rounds, iterate_task, tmp_path, caplog):
    t = iterate_task
    flags = {**SMALL, "pairs_per_round": 64, "max_steps": 1, "rm_steps": 1, "rm_learning_rate": 1e-12}
    rlhfkit.iterate(
        model=t["sft"], reward_model=str(two_rounds / "round-0" / "rm"), data=t["prompts"],
        output_dir=str(tmp_path / "out"), judge=t["judge"], rounds=1, rm_holdout=0.5, **flags,
    )  # fmt: skip
    record = json.loads((tmp_path / "out" / "round-1" / "round.json").read_text())
    assert record["heldout_pairs"] >= 8
    assert record["rm_accuracy_heldout_before"] == record["rm_accuracy_heldout_after"]
    warned = [r for r in caplog.records if "left its accuracy on the" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING] and warned[0].name == "rlhfkit.iterated.reward_models"


def test_split_heldout_is_seeded_and_keeps_order():
    rows = [{"i": i} for i in range(10)]
    trained, held = split_heldout(rows, 0.2, seed=3)
    assert len(held) == 2 and len(trained) == 8 and sorted(trained + held, key=lambda r: r["i"]) == rows
    assert [r["i"] for r in trained] == sorted(r["i"] for r in trained)
    assert split_heldout(rows, 0.2, seed=3) == (trained, held)
    assert split_heldout(rows, 0.0, seed=3) == (rows, [])
    assert len(split_heldout(rows[:3], 0.1, seed=0)[1]) == 1  # at least one pair held out


def test_the_collapse_measures():
    assert distinct_share(["a", "a", "b", "c"]) == 0.75 and distinct_share([]) == 0.0
    assert similarity("we will help you", "we will help you") == 1.0
    assert similarity("we will help you now", "we will help you") == pytest.approx(2 * 4 / 9)
    assert similar_share([("a b c", "a b c"), ("a b", "x y")]) == 0.5
    assert collapsed(0.6, baseline=0.2, threshold=0.5) and not collapsed(0.4, 0.2, 0.5)
    assert not collapsed(0.6, baseline=0.7, threshold=0.5)  # no worse than the start: a narrow task, not collapse
    assert not collapsed(1.0, 0.0, 0.0)  # 0 turns the check off


@pytest.fixture(scope="module")
def collapsed_policy(iterate_task, tmp_path_factory) -> Path:
    """The tiny task's SFT model fine-tuned on one reply to every prompt: it answers (nearly) nothing else."""
    d = tmp_path_factory.mktemp("collapsed")
    prompts = [r["prompt"] for r in read_jsonl(iterate_task["prompts"])]
    (d / "one.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "completion": " go away now"}) + "\n" for p in prompts)
    )
    rlhfkit.sft(
        model=iterate_task["sft"], data=str(d / "one.jsonl"), output_dir=str(d / "policy"), max_steps=40,
        learning_rate=1e-2, batch_size=16, progress=False,
    )  # fmt: skip
    return d / "policy"


def test_a_collapsed_round_is_detected_and_its_pairs_still_differ(
    two_rounds,
    iterate_task,
    collapsed_policy,
    tmp_path,
    caplog,
):
    caplog.set_level(logging.INFO, logger="rlhfkit")
    # Round 1 finished with a policy that collapsed onto one reply; round 2 must see it and pair that reply with
    # the last healthy policy's (round 1's start, the SFT model), so its labels are not coin flips on equal pairs.
    out = tmp_path / "out"
    shutil.copytree(two_rounds, out)
    shutil.rmtree(out / "round-2")
    ppo1 = out / "round-1" / "ppo"
    shutil.copy(collapsed_policy / "model.safetensors", ppo1 / "model.safetensors")
    t = iterate_task
    prompts = [r["prompt"] for r in read_jsonl(t["prompts"])]
    own = sample_pairs(str(ppo1), prompts, GenerationArgs(max_new_tokens=8), 64, 16, "cpu", 5)
    assert similar_share(own) >= 0.9  # the policy now gives the same reply twice
    rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out), judge=t["judge"], rounds=2,
        resume=True, **SMALL,
    )  # fmt: skip
    first = json.loads((out / "round-1" / "round.json").read_text())
    record = json.loads((out / "round-2" / "round.json").read_text())
    assert not first["collapsed"] and record["collapsed"]
    assert record["similar_pairs"] >= 0.5 > first["similar_pairs"]
    assert record["sampled_from"] == [str(ppo1), t["sft"]]
    assert record["similar_pairs_after"] < 0.5  # the pairs the judge saw differ
    assert record["unusable"] < 0.5 * record["pairs"] and record["labels"] > 0
    for row in read_jsonl(out / "round-2" / "pairs.jsonl"):  # the judge told the collapsed reply from the others
        assert "thanks" in row["chosen"] and "thanks" not in row["rejected"]
    assert any("the policy has collapsed" in r.getMessage() for r in caplog.records)
    assert json.loads((out / "summary.json").read_text())["totals"]["collapsed_rounds"] == 1


def test_online_dpo_learns_from_the_judge(iterate_task, tmp_path):
    t = iterate_task
    out = tmp_path / "dpo"
    result = rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out), judge=t["judge"], rounds=2,
        algorithm="dpo", pairs_per_round=32, learning_rate=3e-3, max_new_tokens=8, batch_size=16, progress=False,
    )  # fmt: skip
    summary = result.metrics
    assert summary["totals"]["dpo_steps"] > 0 and summary["totals"]["rm_steps"] == 0
    assert (out / "round-0" / "dpo" / "model.safetensors").is_file() and not (out / "round-0" / "rm").exists()
    for k in (1, 2):
        config = yaml.safe_load((out / f"round-{k}" / "dpo" / "config.yaml").read_text())
        assert config["ref_model"] == t["sft"]  # the reference stays the SFT model
        assert config["model"] == str(out / ("round-0" if k == 1 else "round-1") / "dpo")
        assert config["data"] == str(out / f"round-{k}" / "pairs.jsonl")
    prompts = [r["prompt"] for r in read_jsonl(t["prompts"])]
    gen = GenerationArgs(max_new_tokens=8)
    start = thanks_share([x for p in sample_pairs(t["sft"], prompts, gen, 64, 16, "cpu", 5) for x in p])
    final = thanks_share([x for p in sample_pairs(str(out / "final"), prompts, gen, 64, 16, "cpu", 5) for x in p])
    assert final > start + 0.2, (start, final)


def test_a_policy_that_outruns_its_reward_model_gets_a_larger_kl_coefficient(
    two_rounds, iterate_task, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="rlhfkit")
    # A judge that prefers the shorter reply, which the reward model (trained on 'thanks') does not rank perfectly:
    # with --rm-trust 1 every round from round 2 on is under it and doubles the KL coefficient of its PPO.
    t = iterate_task
    judge = tmp_path / "contrary.py"
    judge.write_text(
        "def prefer(prompts, completions):\n    return [1 if len(a) >= len(b) else 0 for a, b in completions]\n"
    )
    out = tmp_path / "out"
    flags = {**SMALL, "pairs_per_round": 16, "max_steps": 1, "rm_steps": 1, "rm_learning_rate": 1e-12}
    rlhfkit.iterate(
        model=t["sft"], reward_model=str(two_rounds / "round-0" / "rm"), data=t["prompts"], output_dir=str(out),
        judge=f"{judge}:prefer", rounds=3, kl_coef=0.05, rm_trust=1.0, **flags,
    )  # fmt: skip
    rounds = json.loads((out / "summary.json").read_text())["rounds"]
    assert all(r["rm_accuracy_new_pairs"] < 1.0 for r in rounds)
    assert [r["kl_coef"] for r in rounds] == [0.05, 0.1, 0.2]  # round 1 never: its pairs are the SFT model's
    assert [yaml.safe_load((out / f"round-{k}" / "ppo" / "config.yaml").read_text())["kl_coef"] for k in (1, 2, 3)] == [
        0.05,
        0.1,
        0.2,
    ]
    assert sum("the policy outran it" in r.getMessage() for r in caplog.records) == 2
    off = tmp_path / "off"
    rlhfkit.iterate(
        model=t["sft"], reward_model=str(two_rounds / "round-0" / "rm"), data=t["prompts"], output_dir=str(off),
        judge=f"{judge}:prefer", rounds=2, kl_coef=0.05, rm_trust=0.0, **flags,
    )  # fmt: skip
    assert [r["kl_coef"] for r in json.loads((off / "summary.json").read_text())["rounds"]] == [0.05, 0.05]
