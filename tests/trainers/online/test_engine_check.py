"""The warning a --use-vllm run writes when the engine and the trainer disagree: a log-prob gap right after a
weight sync, or groups of identical replies the engine itself found improbable; one line per sign."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch

import rlhfkit
from rlhfkit.trainers.online import run
from rlhfkit.trainers.online.engine_check import EngineCheck, improbable_identical_groups

from .test_use_vllm_option import StandInEngine


class Lines:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, message: str) -> None:
        self.lines.append(message)


def rollout(groups: list[list[list[int]]], logprob: float) -> SimpleNamespace:
    """A rollout of the given groups of replies (token ids, right-padded with 0), each token at ``logprob``."""
    rows = [reply for group in groups for reply in group]
    T = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    return SimpleNamespace(response_ids=ids, action_mask=mask, engine_logprobs=logprob * mask.float())


def test_identical_groups_count_only_where_the_engine_found_the_reply_improbable():
    same, mixed, short_same = [[5, 6, 7]] * 4, [[5, 6, 7], [5, 6], [5, 6, 8], [5, 6, 7]], [[5, 6]] * 4
    r = rollout([same, mixed, short_same], logprob=-1.0)
    # p = e^-3 for `same` (chance e^-9 of 3 repeats) and e^-2 for `short_same` (e^-6): both improbable
    assert improbable_identical_groups(r.response_ids, r.engine_logprobs, r.action_mask, 4) == (2, 3)
    # a peaked policy (each token at p = 0.99) repeats a reply by chance: nothing to report
    r = rollout([same, mixed, short_same], logprob=math.log(0.99))
    assert improbable_identical_groups(r.response_ids, r.engine_logprobs, r.action_mask, 4) == (0, 3)
    # padding does not make replies of different lengths equal; one completion per prompt compares nothing
    r = rollout([[[5, 6, 0], [5, 6]]], logprob=-1.0)
    assert improbable_identical_groups(r.response_ids, r.engine_logprobs, r.action_mask, 2) == (0, 1)
    assert improbable_identical_groups(r.response_ids, r.engine_logprobs, r.action_mask, 1) == (0, 2)


def test_one_line_per_sign_while_it_lasts():
    log = Lines()
    check = EngineCheck(log, group_size=4)
    distinct = rollout([[[1, 2], [3, 4], [5, 6], [7, 8]]] * 4, logprob=-1.0)
    synced = {"rollout/logprob_diff": 1e-5, "time/weight_sync_s": 0.5}
    check.observe(1, distinct, synced)
    assert log.lines == []
    # a gap right after a sync: one line, not repeated while it lasts
    check.observe(2, distinct, {**synced, "rollout/logprob_diff": 0.4})
    check.observe(3, distinct, {**synced, "rollout/logprob_diff": 0.5})
    assert len(log.lines) == 1 and "(step 2)" in log.lines[0] and "0.4" in log.lines[0]
    # a step that samples with weights one update old (no sync) is not checked: there a gap is expected
    check.observe(4, distinct, {"rollout/logprob_diff": 0.5})
    check.observe(5, distinct, synced)
    assert len(log.lines) == 1
    # identical improbable replies in 2 of 4 groups: the second sign, one line
    collapsed = rollout([[[1, 2]] * 4, [[3, 4]] * 4, [[1, 2], [3, 4], [5, 6], [7, 8]], [[1], [2], [3], [4]]], -1.0)
    check.observe(6, collapsed, synced)
    check.observe(7, collapsed, synced)
    assert len(log.lines) == 2 and "(step 6)" in log.lines[1] and "2 of 4 groups" in log.lines[1]
    assert all("\n" not in line and line.startswith("warning (step ") for line in log.lines)
    assert check.warnings == 2


def test_a_grpo_run_whose_engine_disagrees_says_so_once(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The stand-in engine samples with the trainer's model but reports a log-prob of -1 for every token, as an
    engine holding other weights would: the run writes one warning line naming the gap."""
    engine = StandInEngine()
    monkeypatch.setattr(run, "require_vllm", lambda: None)
    monkeypatch.setattr(run, "start_engine", engine.start)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"the cat {w}"}) + "\n" for w in "sat ran hid ate".split()))
    rlhfkit.grpo(
        model=str(tiny_model_dir), data=str(prompts), output_dir=tmp_path / "out",
        reward_fns=[lambda prompts, completions, **kw: [float(len(c)) for c in completions]],
        batch_size=4, num_generations=2, max_new_tokens=4, max_steps=3, progress=False, use_vllm=True,
    )  # fmt: skip
    lines = [line for line in capsys.readouterr().err.splitlines() if "vLLM engine and the trainer disagree" in line]
    assert len(lines) == 1 and lines[0].startswith("warning (step 1)") and "rollout/logprob_diff" in lines[0]
