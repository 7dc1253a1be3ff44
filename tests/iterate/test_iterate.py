"""`rlhfkit iterate` with a rule judge on the tiny 'thanks' task: the rounds' files, the reward model's accuracy
on each round's new pairs, the reward model continued on the union of the pairs, PPO continued from the last
policy and value model against the SFT reference, the judge's preference rising in the policy, resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import rlhfkit
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.errors import UserError
from rlhfkit.iterated.models import sample_pairs
from rlhfkit.models import loading
from tests.helpers import read_jsonl, run_cli

from .conftest import SMALL, thanks_share


def test_rounds_write_their_files_and_the_summary(two_rounds):
    out = two_rounds
    for k in (1, 2):
        r = out / f"round-{k}"
        for name in ("candidates.jsonl", "pairs.jsonl", "rm_data.jsonl", "round.json", "rm/model.safetensors"):
            assert (r / name).is_file(), r / name
        assert (r / "ppo" / "model.safetensors").is_file() and (r / "ppo" / "value" / "model.safetensors").is_file()
        assert not (r / "ppo" / "checkpoints").exists()
    assert (out / "round-0" / "rm" / "reward_stats.json").is_file()
    assert (out / "final" / "model.safetensors").is_file() and not (out / "final" / "metrics.jsonl").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["totals"] == {**summary["totals"], "rounds": 2, "ppo_steps": 20, "rm_steps": 40}
    for r in summary["rounds"]:
        assert r["labels"] == len(read_jsonl(out / f"round-{r['round']}" / "pairs.jsonl")) > 0
        assert r["labels"] + r["no_preference"] + r["unusable"] == r["pairs"] == 32
        assert 0.0 <= r["rm_accuracy_new_pairs"] <= 1.0
        assert r["heldout_pairs"] == round(0.2 * r["labels"]) > 0  # the default --rm-holdout
        assert 0.0 <= r["rm_accuracy_heldout_before"] <= 1.0 and 0.0 <= r["rm_accuracy_heldout_after"] <= 1.0
        assert 0.0 < r["distinct_replies"] <= 1.0 and 0.0 <= r["similar_pairs"] <= 1.0 and not r["collapsed"]
        assert r["reward"] is not None and r["kl"] is not None
        phases = r["phase_seconds"]  # where the round's time went
        assert set(phases) == {"sample", "label", "rm_accuracy", "rm", "ppo"} and phases["ppo"] > 0
        assert sum(phases.values()) <= r["seconds"] + 0.1 * len(phases)
    assert summary["rm_accuracy_new_pairs"] == [r["rm_accuracy_new_pairs"] for r in summary["rounds"]]
    assert summary["rm_accuracy_heldout"] == [
        [r["rm_accuracy_heldout_before"], r["rm_accuracy_heldout_after"]] for r in summary["rounds"]
    ]


def test_every_judged_pair_is_the_judges_preference(two_rounds):
    for k in (1, 2):
        for row in read_jsonl(two_rounds / f"round-{k}" / "pairs.jsonl"):
            assert "thanks" in row["chosen"] and "thanks" not in row["rejected"]


def test_reward_model_continues_on_all_pairs_and_ppo_on_the_last_round(two_rounds, iterate_task):
    out = two_rounds
    offline = read_jsonl(iterate_task["prefs"])
    round_pairs = [read_jsonl(out / f"round-{k}" / "pairs.jsonl") for k in (1, 2)]
    held = [read_jsonl(out / f"round-{k}" / "heldout.jsonl") for k in (1, 2)]
    assert all(h and all(p in pairs for p in h) for h, pairs in zip(held, round_pairs))

    def but(rows, out_rows):
        return [r for r in rows if r not in out_rows]

    # a round's update leaves its held-out pairs out; they join the training pairs from the next round on
    assert read_jsonl(out / "round-1" / "rm_data.jsonl") == offline + but(round_pairs[0], held[0])
    assert read_jsonl(out / "round-2" / "rm_data.jsonl") == offline + round_pairs[0] + but(round_pairs[1], held[1])
    rm2 = yaml.safe_load((out / "round-2" / "rm" / "config.yaml").read_text())
    assert rm2["model"] == str(out / "round-1" / "rm")  # continued, not retrained from the SFT model
    ppo1 = yaml.safe_load((out / "round-1" / "ppo" / "config.yaml").read_text())
    ppo2 = yaml.safe_load((out / "round-2" / "ppo" / "config.yaml").read_text())
    assert ppo1["model"] == iterate_task["sft"]
    assert ppo1["value_model"] == str(out / "round-0" / "rm")  # the value model starts from the RM
    assert ppo2["model"] == str(out / "round-1" / "ppo")
    assert ppo2["value_model"] == str(out / "round-1" / "ppo" / "value")
    assert ppo2["ref_model"] == iterate_task["sft"]  # the reference stays the SFT model
    assert ppo2["reward_model"] == str(out / "round-2" / "rm")


def test_the_judges_preference_rises_in_the_policy(two_rounds, iterate_task):
    def share(rows):
        return thanks_share([x for r in rows for x in r["responses"]])

    first = share(read_jsonl(two_rounds / "round-1" / "candidates.jsonl"))  # the SFT model's replies
    second = share(read_jsonl(two_rounds / "round-2" / "candidates.jsonl"))  # after round 1's PPO
    prompts = [r["prompt"] for r in read_jsonl(iterate_task["prompts"])]
    final = sample_pairs(str(two_rounds / "final"), prompts, GenerationArgs(max_new_tokens=8), 64, 16, "cpu", 5)
    last = thanks_share([x for pair in final for x in pair])
    assert second > first + 0.1 and last > first + 0.2, (first, second, last)


def _stop_in_rm(r: Path) -> None:  # killed while its reward model trained: no statistics, no PPO
    (r / "rm" / "reward_stats.json").unlink()
    shutil.rmtree(r / "ppo")


def _stop_in_ppo(r: Path) -> None:  # killed while PPO trained: its log and config written, no model yet
    (r / "ppo" / "model.safetensors").unlink()
    shutil.rmtree(r / "ppo" / "value")


@pytest.mark.parametrize(
    "stop",
    [lambda r: shutil.rmtree(r / "ppo"), _stop_in_rm, _stop_in_ppo],
    ids=["after-its-reward-model", "inside-its-reward-model", "inside-ppo"],
)
def test_resume_keeps_finished_rounds_and_labelled_pairs(two_rounds, iterate_task, tmp_path, capsys, stop):
    out = tmp_path / "out"
    shutil.copytree(two_rounds, out)
    kept = {
        p: (out / p).read_bytes() for p in ("round-1/round.json", "round-2/candidates.jsonl", "round-2/pairs.jsonl")
    }
    # round 2 stopped before its record was written; what its stopped stage left is replaced on resume
    stop(out / "round-2")
    (out / "round-2" / "round.json").unlink()
    t = iterate_task
    flags = ["--model", t["sft"], "--prefs", t["prefs"], "--data", t["prompts"], "--output-dir", out]
    flags += ["--judge", t["judge"], "--rounds", 2]
    flags += [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    code, _, err = run_cli(capsys, "iterate", *flags)
    assert code == 1 and "--resume" in err  # a folder with rounds is never overwritten silently
    code, _, err = run_cli(capsys, "iterate", *flags, "--resume")
    assert code == 0, err
    assert "round 2:" in err and "round 1:" not in err  # round 1 was not redone
    for path, data in kept.items():
        assert (out / path).read_bytes() == data, path
    assert (out / "round-2" / "ppo" / "value" / "model.safetensors").is_file()
    assert (out / "round-2" / "rm" / "reward_stats.json").is_file()
    assert len(json.loads((out / "summary.json").read_text())["rounds"]) == 2


def _judge_file(tmp_path, body: str) -> str:
    path = tmp_path / "bad_judge.py"
    path.write_text(body)
    return f"{path}:prefer"


@pytest.mark.parametrize(
    "body, message",
    [
        ("def prefer(prompts):\n    return []\n", "must take (prompts, completions"),
        ("prefer = 3\n", "is not a function"),
        ("import not_a_module_anywhere\n", "cannot import"),
    ],
)
def test_a_bad_judge_is_one_clear_error_before_training(iterate_task, tmp_path, capsys, body, message):
    t = iterate_task
    code, _, err = run_cli(
        capsys, "iterate", "--model", t["sft"], "--prefs", t["prefs"], "--data", t["prompts"],
        "--output-dir", tmp_path / "out", "--judge", _judge_file(tmp_path, body),
    )  # fmt: skip
    assert code == 1 and message in err and "--judge" in err, err
    assert not (tmp_path / "out" / "round-0").exists()  # nothing was trained


def test_a_judge_answering_out_of_range_names_the_pair(two_rounds, iterate_task, tmp_path):
    t = iterate_task
    judge = _judge_file(
        tmp_path, "def prefer(prompts, completions, **kw):\n    return [0] * (len(completions) - 1) + [2]\n"
    )
    with pytest.raises(UserError, match=r"judge.*answer 2 is not 0"):
        rlhfkit.iterate(
            model=t["sft"], reward_model=str(two_rounds / "round-0" / "rm"), data=t["prompts"],
            output_dir=str(tmp_path / "out"), judge=judge, rounds=1, **SMALL,
        )  # fmt: skip


def test_options_are_checked(iterate_task, tmp_path):
    t = iterate_task
    base = dict(model=t["sft"], data=t["prompts"], output_dir=str(tmp_path / "out"))
    with pytest.raises(UserError, match="reward_model.*prefs"):
        rlhfkit.iterate(**base, judge=t["judge"])
    with pytest.raises(UserError, match="FILE.py:NAME, 'human', or a task's raters"):
        rlhfkit.iterate(**base, judge="judge.py", prefs=t["prefs"])
    with pytest.raises(UserError, match="rounds must be > 0"):
        rlhfkit.iterate(**base, judge=t["judge"], prefs=t["prefs"], rounds=0)


def test_the_python_api_takes_the_judge_as_a_function(two_rounds, iterate_task, tmp_path):
    calls = []

    def prefer_first(prompts, completions):
        calls.append(len(completions))
        return [0] * len(completions)

    t = iterate_task
    out = tmp_path / "out"
    flags = {**SMALL, "pairs_per_round": 8, "max_steps": 1, "rm_steps": 1}
    rlhfkit.iterate(
        model=t["sft"], reward_model=str(two_rounds / "round-0" / "rm"), data=t["prompts"], output_dir=str(out),
        judge=prefer_first, rounds=1, **flags,
    )  # fmt: skip
    pairs = read_jsonl(out / "round-1" / "pairs.jsonl")
    assert calls and len(pairs) == calls[0]
    candidates = {
        (r["prompt"], r["responses"][0]): r["responses"][1] for r in read_jsonl(out / "round-1" / "candidates.jsonl")
    }
    assert all(candidates[(p["prompt"], p["chosen"])] == p["rejected"] for p in pairs)  # the first reply won
    assert "<python function" in (out / "config.yaml").read_text()
    with pytest.raises(UserError, match="must take"):
        rlhfkit.iterate(
            model=t["sft"], reward_model=str(two_rounds / "round-0" / "rm"), data=t["prompts"],
            output_dir=str(tmp_path / "bad"), judge=lambda prompts: [], rounds=1, **flags,
        )  # fmt: skip


def test_an_ensemble_continues_member_by_member(iterate_task, tmp_path):
    t = iterate_task
    out = tmp_path / "out"
    flags = {**SMALL, "pairs_per_round": 8, "max_steps": 1, "rm_steps": 2, "rm_initial_steps": 2}
    rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out), judge=t["judge"], rounds=1,
        ensemble=2, ensemble_mode="worst-case", **flags,
    )  # fmt: skip
    info = json.loads((out / "round-1" / "rm" / "ensemble.json").read_text())
    assert info["members"] == [".", "member-1"]
    member = yaml.safe_load((out / "round-1" / "rm" / "member-1" / "config.yaml").read_text())
    assert member["model"] == str(out / "round-0" / "rm" / "member-1")  # each member from its own weights
    ppo = yaml.safe_load((out / "round-1" / "ppo" / "config.yaml").read_text())
    assert ppo["reward_model"] == str(out / "round-1" / "rm") and ppo["ensemble_mode"] == "worst-case"


def test_lora_rounds_save_adapters_and_carry_the_policys_on(iterate_task, tmp_path):
    """With --lora-r, --rm-lora-r and --save-merged false every model the loop trains is a LoRA adapter: the
    policy's adapter on the SFT model goes on training round after round (its base stays the SFT model, the
    reference its adapters off), the reward model's and the value model's stack on the last round's."""
    t, out = iterate_task, tmp_path / "out"
    small = {**SMALL, "max_steps": 3, "rm_steps": 4, "rm_initial_steps": 4, "pairs_per_round": 16}
    rlhfkit.iterate(
        model=t["sft"], prefs=t["prefs"], data=t["prompts"], output_dir=str(out), judge=t["judge"], rounds=2,
        lora_r=4, lora_alpha=8, rm_lora_r=4, save_merged=False, **small,
    )  # fmt: skip
    sft = str(Path(t["sft"]).resolve())
    assert not list(out.rglob("model.safetensors"))  # nothing saved whole
    for k in (1, 2):
        assert loading.adapter_chain(str(out / f"round-{k}" / "ppo")) == [str(out / f"round-{k}" / "ppo"), sft]
        assert loading.adapter_base(str(out / f"round-{k}" / "rm")) == str((out / f"round-{k - 1}" / "rm").resolve())
    assert loading.adapter_base(str(out / "round-2" / "ppo" / "value")) == str(
        (out / "round-1" / "ppo" / "value").resolve()
    )
    assert loading.adapter_base(str(out / "final")) == sft
    # each round moved the policy: its adapter continued, not started again at zero
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        policies = [
            loading.load_causal_lm(str(p)).eval()(input_ids=ids).logits
            for p in (sft, *[out / f"round-{k}" / "ppo" for k in (1, 2)])
        ]
    assert (policies[1] - policies[0]).abs().max() > 1e-4 and (policies[2] - policies[1]).abs().max() > 1e-4
    first = load_file(out / "round-1" / "ppo" / "adapter_model.safetensors")
    second = load_file(out / "round-2" / "ppo" / "adapter_model.safetensors")
    assert first.keys() == second.keys()
