"""Log-probs and entropy block by block: the plain formulas' values and gradients (float64 oracle), with blocks
forced small so every code path is crossed, -inf logits (top-k filtering) included."""

from __future__ import annotations

import torch

from rlhfkit.ops.vocab_chunks import chunked_entropy, chunked_logprobs


def plain_logprobs(logits, labels):
    return torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)


def plain_entropy(logits):
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


BLOCK = 3 * 97  # 3 rows of V = 97 per block: 7 blocks for 20 rows


def batch(seed=0, B=4, T=5, V=97):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    logits[0, 1, :40] = float("-inf")  # filtered-out tokens
    labels = torch.randint(V, (B, T), generator=g)
    labels[0, 1] = 50  # a label that survives the filter
    return logits, labels


def grads(fn, logits, *args):
    x = logits.clone().float().requires_grad_(True)
    out = fn(x, *args)
    weights = torch.linspace(-1, 2, out.numel()).view(out.shape)
    (out * weights).sum().backward()
    return out.detach().double(), x.grad.double()


def oracle(fn, logits, *args):
    x = logits.clone().requires_grad_(True)
    out = fn(x, *args)
    (out * torch.linspace(-1, 2, out.numel()).view(out.shape).double()).sum().backward()
    return out.detach(), torch.nan_to_num(x.grad, nan=0.0)


def test_chunked_logprobs_values_and_gradients():
    logits, labels = batch()
    got, got_grad = grads(chunked_logprobs, logits, labels, BLOCK)
    want, want_grad = oracle(plain_logprobs, logits, labels)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-6)


def test_chunked_entropy_values_and_gradients():
    logits, _ = batch(1)
    got, got_grad = grads(chunked_entropy, logits, BLOCK)
    want, want_grad = oracle(plain_entropy, logits)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-6)
    assert torch.isfinite(got_grad).all() and (got_grad[0, 1, :40] == 0).all()


def test_half_precision_logits_give_float32_and_a_gradient_of_their_dtype():
    logits, labels = batch(3)
    x = logits.to(torch.bfloat16).requires_grad_(True)
    out = chunked_logprobs(x, labels, BLOCK)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), plain_logprobs(x.detach().double(), labels), rtol=0, atol=1e-5)
