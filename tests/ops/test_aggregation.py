import math

import pytest
import torch

from rlhfkit.ops import aggregate_loss, masked_mean

TOL = dict(rtol=0, atol=1e-6)
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# row 0: 3 real tokens [1, 2, 3] (mean 2); row 1: 1 real token [4] (mean 4); row 2: empty.
# Padding holds inf and NaN: it must not reach the loss or the gradient.
def loss_and_mask():
    loss = t([[1.0, 2.0, 3.0], [4.0, math.inf, 6.0], [math.nan, 8.0, 9.0]]).requires_grad_()
    return loss, t([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    "mode,max_len,value,grad",
    [
        ("token-mean", None, 10 / 4, [[0.25] * 3, [0.25, 0, 0], [0, 0, 0]]),
        # the empty row is excluded: (2 + 4) / 2
        ("seq-mean-token-mean", None, 3.0, [[1 / 6] * 3, [0.5, 0, 0], [0, 0, 0]]),
        ("seq-mean-token-sum-norm", None, 10 / 9, [[1 / 9] * 3, [1 / 9, 0, 0], [0, 0, 0]]),
        ("seq-mean-token-sum-norm", 5, 10 / 15, [[1 / 15] * 3, [1 / 15, 0, 0], [0, 0, 0]]),
    ],
)
def test_aggregate_loss_by_hand(mode, max_len, value, grad):
    loss, mask = loss_and_mask()
    out = aggregate_loss(loss, mask, mode, max_len=max_len)
    assert out.dim() == 0
    assert out.item() == pytest.approx(value, abs=1e-12)
    out.backward()
    torch.testing.assert_close(loss.grad, t(grad), **TOL)


def test_token_mean_is_masked_mean():
    loss, mask = torch.randn(4, 6, dtype=torch.float64), (torch.rand(4, 6) > 0.4).double()
    torch.testing.assert_close(aggregate_loss(loss, mask, "token-mean"), masked_mean(loss, mask), **TOL)


def test_seq_mean_token_mean_matches_naive_loop():
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    lengths = [4, 1, 0, 3, 2]
    mask = t([[float(i < n) for i in range(4)] for n in lengths])
    row_means = [sum(loss[b, :n].tolist()) / n for b, n in enumerate(lengths) if n > 0]
    expected = sum(row_means) / len(row_means)
    assert aggregate_loss(loss, mask.bool(), "seq-mean-token-mean").item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_empty_mask_gives_zero_without_nan(mode):
    loss = t([[1.0, math.nan], [math.inf, 2.0]]).requires_grad_()
    out = aggregate_loss(loss, t([[0, 0], [0, 0]]), mode)
    assert out.item() == 0.0
    out.backward()
    torch.testing.assert_close(loss.grad, t([[0.0, 0.0], [0.0, 0.0]]), **TOL)


def test_aggregate_loss_bad_arguments():
    loss, mask = loss_and_mask()
    with pytest.raises(ValueError, match="seq-sum"):
        aggregate_loss(loss, mask, "seq-sum")
    with pytest.raises(ValueError, match="max_len"):
        aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_len=0)
