"""Sparse embedding gradients (rlhfkit.accel.online.sparse_embedding_grads): only the looked-up rows are held
until the step, which makes them dense and takes the same step as with dense gradients."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from torch import nn

from rlhfkit.accel import online
from rlhfkit.training import updates


class _Accelerator(SimpleNamespace):
    def clip_grad_norm_(self, params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def test_sparse_embedding_grads_take_the_dense_step():
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 1))
    sparse = copy.deepcopy(dense)
    assert online.sparse_embedding_grads(sparse) == 1
    assert online.sparse_embedding_grads(sparse) == 0  # already sparse
    batches = [torch.tensor([[1, 2, 2, 7]]), torch.tensor([[7, 3, 1, 1]])]  # repeated rows, over two backwards
    for model in (dense, sparse):
        for ids in batches:
            model(ids).pow(2).sum().backward()
    grad = sparse[0].weight.grad
    assert grad.is_sparse and grad._nnz() <= 8  # at most a row per looked-up token, not 50
    assert torch.allclose(grad.to_dense(), dense[0].weight.grad, atol=1e-6)
    norms = []
    for model in (dense, sparse):
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        norms.append(updates.step(_Accelerator(), model, optimizer, scheduler, max_grad_norm=0.5))
    assert norms[0] == norms[1] or abs(norms[0] - norms[1]) < 1e-5
    for a, b in zip(dense.parameters(), sparse.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
