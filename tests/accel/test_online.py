"""The online trainers' performance choreography (rlhfkit.accel.online.OnlineAccel): what it arranges when the
performance code is on, and that it arranges nothing when it is off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlhfkit.accel import online
from rlhfkit.accel.online import Networks, OnlineAccel, ValuePass

CPU = torch.device("cpu")


def _value_model() -> nn.Module:
    return nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))


def _accel(device=CPU, **overrides) -> OnlineAccel:
    args = dict(value_model=_value_model(), value_pass_apart=True, single_process=True, first_pass_reused=True)
    return OnlineAccel(device, **{**args, "critic": True, **overrides})


@pytest.fixture
def heap(monkeypatch) -> list:
    """Records the heap calls instead of changing this process's allocator; the switch on."""
    monkeypatch.delenv("RLHFKIT_ACCEL", raising=False)
    calls = []
    monkeypatch.setattr(online, "keep_freed_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(online, "release_freed_memory", lambda: calls.append("release"))
    monkeypatch.setattr(online, "create_optimizer_state", lambda optimizer: calls.append("moments"))
    return calls


def test_off_arranges_nothing(monkeypatch, heap):
    monkeypatch.setenv("RLHFKIT_ACCEL", "0")
    accel = _accel()
    assert accel.value_pass is ValuePass.JOINT and not accel.keeps_heap and not accel.trims_heap
    assert accel.update_passes(8, value_done=False) == [(Networks.ALL, 8)]
    assert accel.first_pass_networks is Networks.ALL
    accel.prepare(torch.optim.AdamW(accel.value_model.parameters()))
    accel.after_sampling()
    accel.after_rollout()
    assert heap == [] and not accel.value_model[0].sparse


def test_on_the_cpu_the_heap_is_kept_and_the_value_pass_runs_apart(heap):
    accel = _accel()
    assert accel.keeps_heap and accel.value_pass is ValuePass.IN_ROLLOUT
    assert accel.first_pass_networks is Networks.POLICY
    # the policy's pass, then the value model's in quarter micro-batches unless it ran with the rollout
    assert accel.update_passes(8, value_done=False) == [(Networks.POLICY, 8), (Networks.VALUE, 2)]
    assert accel.update_passes(8, value_done=True) == [(Networks.POLICY, 8)]
    assert accel.value_rows(3) == 1
    accel.prepare(torch.optim.AdamW(accel.value_model.parameters()))
    assert heap == ["keep", "moments"] and accel.value_model[0].sparse  # its gradients wait for the step
    accel.after_rollout()
    assert heap == ["keep", "moments"]  # kept, not trimmed


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (dict(first_pass_reused=False), ValuePass.APART),
        (dict(critic=False), ValuePass.APART),
        (dict(single_process=False), ValuePass.JOINT),  # several processes: one backward per micro-batch
        (dict(value_pass_apart=False), ValuePass.JOINT),
        (dict(value_model=None), ValuePass.JOINT),  # a value head on the policy
    ],
)
def test_the_value_pass_arrangement(heap, overrides, expected):
    assert _accel(**overrides).value_pass is expected


def test_off_the_cpu_the_heap_is_left_alone_and_the_value_pass_joint(heap):
    accel = _accel(torch.device("meta"))  # not a CPU run
    assert not accel.keeps_heap and not accel.trims_heap and accel.value_pass is ValuePass.JOINT and heap == []


def test_the_heap_is_trimmed_where_it_cannot_be_kept(monkeypatch, heap):
    monkeypatch.setattr(online, "keep_freed_memory", lambda: False)
    accel = _accel()
    accel.after_sampling()
    accel.after_rollout()
    assert accel.trims_heap and heap == ["release", "release"]
