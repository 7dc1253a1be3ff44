import math

import pytest
import torch

from rlhfkit.ops import logprobs_from_logits

TOL = dict(rtol=0, atol=1e-6)


def test_logprobs_by_hand():
    logits = torch.tensor([[[math.log(0.5), math.log(0.25), math.log(0.25)], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    labels = torch.tensor([[0, 2]])
    expected = torch.tensor([[math.log(0.5), -math.log(3)]], dtype=torch.float64)
    torch.testing.assert_close(logprobs_from_logits(logits, labels), expected, **TOL)
    # softmax is shift-invariant, and large logits must not overflow
    torch.testing.assert_close(logprobs_from_logits(logits + 1e4, labels), expected, **TOL)


def test_logprobs_match_python_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    labels = torch.randint(0, 5, (2, 3))
    expected = [
        [
            logits[b, i, labels[b, i]].item() - math.log(sum(math.exp(z) for z in logits[b, i].tolist()))
            for i in range(3)
        ]
        for b in range(2)
    ]
    out = logprobs_from_logits(logits, labels)
    assert out.shape == (2, 3)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), **TOL)


def test_logprobs_gradient_is_onehot_minus_softmax():
    logits = torch.zeros(1, 1, 3, dtype=torch.float64, requires_grad=True)
    logprobs_from_logits(logits, torch.tensor([[0]])).sum().backward()
    expected = torch.tensor([[[2 / 3, -1 / 3, -1 / 3]]], dtype=torch.float64)
    torch.testing.assert_close(logits.grad, expected, **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logprobs_half_precision_upcasts(dtype):
    torch.manual_seed(1)
    logits = (torch.randn(3, 4, 11) * 3).to(dtype)
    labels = torch.randint(0, 11, (3, 4))
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    expected = logprobs_from_logits(logits.double(), labels).float()
    torch.testing.assert_close(out, expected, **TOL)
