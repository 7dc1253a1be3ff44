"""The online trainers' performance choreography (rlhfkit.accel.online.OnlineAccel): what it arranges when the
performance code is on, and that it arranges nothing when it is off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlhfkit.accel import online
from rlhfkit.accel.online import OnlineAccel

CPU = torch.device("cpu")


def _value_model() -> nn.Module:
    return nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))


def _accel(device=CPU, **overrides) -> OnlineAccel:
    args = dict(value_model=_value_model(), value_pass_apart=True, single_process=True)
    return OnlineAccel(device, **{**args, **overrides})


@pytest.fixture
def heap(monkeypatch) -> list:
    """Records the heap calls instead of changing this process's allocator; the switch on."""
    monkeypatch.delenv("RLHFKIT_ACCEL", raising=False)
    calls = []
    monkeypatch.setattr(online, "keep_freed_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(online, "release_freed_memory", lambda: calls.append("release"))
    return calls


def test_off_arranges_nothing(monkeypatch, heap):
    monkeypatch.setenv("RLHFKIT_ACCEL", "0")
    accel = _accel()
    assert not accel.value_apart and not accel.keeps_heap and not accel.trims_heap
    accel.after_sampling()
    accel.after_rollout()
    assert heap == []


def test_on_the_cpu_the_heap_is_kept_and_the_value_pass_runs_apart(heap):
    accel = _accel()
    assert accel.keeps_heap and accel.value_apart
    # the value model's micro-batches a quarter of the policy's
    assert accel.value_rows(8) == 2 and accel.value_rows(3) == 1
    accel.after_sampling()
    accel.after_rollout()
    assert heap == ["keep"]  # kept, not trimmed


@pytest.mark.parametrize(
    ("overrides", "apart"),
    [
        (dict(), True),
        (dict(single_process=False), False),  # several processes: one backward per micro-batch
        (dict(value_pass_apart=False), False),
        (dict(value_model=None), False),  # a value head on the policy
    ],
)
def test_the_value_pass_arrangement(heap, overrides, apart):
    assert _accel(**overrides).value_apart is apart


def test_off_the_cpu_the_heap_is_left_alone_and_the_value_pass_joint(heap):
    accel = _accel(torch.device("meta"))  # not a CPU run
    assert not accel.keeps_heap and not accel.trims_heap and not accel.value_apart and heap == []


def test_the_heap_is_trimmed_where_it_cannot_be_kept(monkeypatch, heap):
    monkeypatch.setattr(online, "keep_freed_memory", lambda: False)
    accel = _accel()
    accel.after_sampling()
    accel.after_rollout()
    assert accel.trims_heap and heap == ["release", "release"]
