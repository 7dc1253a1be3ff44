"""The decode loop's two pieces of math: top-k / top-p filtering (oracle: Hugging Face's warpers) and the
inverse-CDF categorical sampler (oracle: the distribution itself, over many draws)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rlhfkit.models.sampling import filter_logits, sample_from_logits


def hf_filter(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Oracle: the warpers `generate(do_sample=True, ...)` chains, in its order, with its on/off rules."""
    if temperature != 1.0:
        logits = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k != 0:
        logits = TopKLogitsWarper(top_k)(None, logits)
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(None, logits)
    return logits


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_filter_keeps_the_same_tokens_as_the_hugging_face_warpers(temperature):
    gen = torch.Generator().manual_seed(0)
    smooth = 2 * torch.randn(32, 50, generator=gen)
    tied = (smooth * 2).round() / 2  # many equal logits, so ties at the top-k / top-p boundary are tested
    peaked = smooth.clone()
    peaked[:, 7] += 20  # one token holds > 99% of the mass: top-p keeps only it
    logits = torch.cat([smooth, tied, peaked])  # [96, 50]
    for top_k in [0, 1, 3, 10, 49, 50, 80]:
        for top_p in [1.0, 0.999, 0.9, 0.5, 0.1, 0.0]:
            got = filter_logits(logits, temperature, top_k, top_p)
            want = hf_filter(logits, temperature, top_k, top_p)
            assert torch.equal(got.isinf(), want.isinf()), (top_k, top_p)
            assert torch.equal(got, want), (top_k, top_p)  # kept logits are the scaled originals, bit for bit
    kept = filter_logits(tied, temperature, 3, 1.0).isfinite().sum(-1)
    assert kept.min() >= 3 and kept.max() > 3  # ties at the k-th value are kept (the oracle's rule), not broken
    assert filter_logits(peaked, temperature, 0, 0.9).isfinite().sum(-1).eq(1).all()


def test_filter_rejects_bad_settings():
    with pytest.raises(ValueError, match="top_k"):
        filter_logits(torch.zeros(1, 4), 1.0, -1, 1.0)
    with pytest.raises(ValueError, match="top_p"):
        filter_logits(torch.zeros(1, 4), 1.0, 0, 1.5)


PROBS = torch.tensor([0.0, 0.3, 0.25, 0.0, 0.2, 0.12, 0.08, 0.05, 0.0])  # zeros first, inside and last


def test_inverse_cdf_sampler_draws_each_token_with_its_probability():
    n = 200_000
    torch.manual_seed(0)
    draws = sample_from_logits(PROBS.log().expand(n, -1))  # [n], one batched call
    assert draws.shape == (n,) and draws.dtype == torch.long
    freq = torch.bincount(draws, minlength=len(PROBS)).double() / n
    assert freq[PROBS == 0].sum() == 0  # a zero-probability token is never drawn
    se = (PROBS * (1 - PROBS) / n).sqrt().double()  # binomial standard error of each frequency (<= 0.0011)
    assert ((freq - PROBS.double()).abs() <= 5 * se).all(), (freq, PROBS)
    torch.manual_seed(0)
    assert torch.equal(sample_from_logits(PROBS.log().expand(n, -1)), draws)  # seeded -> reproducible


def test_inverse_cdf_sampler_edges_of_the_uniform_land_on_positive_tokens(monkeypatch):
    logits = PROBS.log().expand(2, -1)  # tokens 0, 3 and 8 have probability 0
    for u, want in [(0.0, 1), (1.0, 7)]:  # u = 1 cannot come from rand(), but must not fall off the end
        monkeypatch.setattr(torch, "rand", lambda *shape, u=u, **kw: torch.full(*shape, u, **kw))
        assert sample_from_logits(logits).tolist() == [want, want]
