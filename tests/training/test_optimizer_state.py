"""The optimizer's state made before the first step (rlhfkit.accel.online.create_optimizer_state): the same
values the first step would make, so training goes on bit for bit as without it."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from rlhfkit.accel import online


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(20, 6), nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 1))


def _groups(model: nn.Module) -> list[dict]:
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def _train(model: nn.Module, optimizer, steps: int = 3) -> None:
    ids = torch.tensor([[1, 4, 4, 9], [3, 0, 19, 7]])
    for _ in range(steps):
        model(ids).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda groups: torch.optim.AdamW(groups, lr=0.05, fused=True),
        lambda groups: torch.optim.AdamW(groups, lr=0.05),
        lambda groups: torch.optim.Adam(groups, lr=0.05, amsgrad=True),
    ],
    ids=["adamw-fused", "adamw", "adam-amsgrad"],
)
def test_state_made_early_trains_the_same(make):
    lazy_model = _model()
    early_model = copy.deepcopy(lazy_model)
    lazy, early = make(_groups(lazy_model)), make(_groups(early_model))
    before = [p.detach().clone() for p in early_model.parameters()]
    assert online.create_optimizer_state(early) == len(before)
    for p, old in zip(early_model.parameters(), before):
        assert torch.equal(p, old) and p.grad is None  # no parameter moved, no gradient left behind
        state = early.state[p]
        assert float(state["step"]) == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    assert [g["lr"] for g in early.param_groups] == [0.05, 0.05]
    assert [g["weight_decay"] for g in early.param_groups] == [0.1, 0.0]
    assert online.create_optimizer_state(early) == 0  # made already
    _train(lazy_model, lazy)
    _train(early_model, early)
    assert not any(torch.equal(p, old) for p, old in zip(early_model.parameters(), before))  # it trained
    for a, b in zip(lazy_model.parameters(), early_model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(lazy_model.parameters(), early_model.parameters()):
        for key, value in lazy.state[a].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(early.state[b][key])), key


def test_through_accelerate_and_left_alone_elsewhere():
    model = _model()
    optimizer = Accelerator(cpu=True).prepare(torch.optim.AdamW(model.parameters(), lr=0.01))
    assert online.create_optimizer_state(optimizer) == len(list(model.parameters()))
    sgd = torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)  # its first step is not a zero step
    assert online.create_optimizer_state(sgd) == 0 and not sgd.state
    with_grads = _model()
    with_grads[3](torch.ones(1, 6)).sum().backward()
    adam = torch.optim.AdamW(with_grads.parameters(), lr=0.1)
    assert online.create_optimizer_state(adam) == 0 and not adam.state  # gradients already there: not touched
