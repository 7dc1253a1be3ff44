"""Block-wise vocabulary log-probs as the models' passes take them (``rlhfkit.accel.vocab``): the switch to
blocks above the threshold and only under ``--accel auto``, and the fused LM head's values and gradients (float64
oracle), with blocks forced small so every code path is crossed."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.accel import vocab
from rlhfkit.accel.vocab import head_logprobs
from tests.ops.test_vocab_chunks import batch, plain_entropy, plain_logprobs


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", 3 * 97)  # 3 rows of V = 97 per block: 7 blocks for 20 rows


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_the_passes_switch_to_blocks_above_the_threshold_under_auto_only(small_blocks, monkeypatch, mode):
    from rlhfkit.accel import switched

    logits, labels = batch(2)
    calls = []
    for name in ("chunked_logprobs", "chunked_entropy"):
        fn = getattr(vocab, name)
        monkeypatch.setattr(vocab, name, lambda *a, _fn=fn, _n=name: calls.append(_n) or _fn(*a))
    x = logits.float()
    with switched(mode):
        torch.testing.assert_close(
            vocab.logprobs(x, labels).double(), plain_logprobs(logits, labels), rtol=0, atol=1e-5
        )
        torch.testing.assert_close(vocab.entropy(x).double(), plain_entropy(logits), rtol=0, atol=1e-5)
        assert calls == (["chunked_logprobs", "chunked_entropy"] if mode == "auto" else [])
        calls.clear()
        vocab.logprobs(x[:1, :1], labels[:1, :1]), vocab.entropy(x[:1, :1])  # 97 entries: the plain path
        assert calls == []


class PaddedProduct(vocab.Product):
    """Block products into new tensors, each block padded to a multiple of 4 rows (as oneDNN's are to a few
    sizes); records the row counts it was given."""

    def __init__(self):
        self.seen = []

    def mm(self, a, b, slot):
        self.seen.append(a.shape[0])
        return torch.mm(a, b)

    def rows(self, m):
        return -(-m // 4) * 4


def products():
    from rlhfkit.accel.onednn import onednn_ready

    return ["plain", "padded"] + (["onednn"] if onednn_ready() else [])


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. torch resizing a kept block it was given as out=
@pytest.mark.parametrize("product", products())
@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_logprobs_never_build_the_logits_and_give_their_values_and_gradients(
    small_blocks, temperature, with_entropy, product
):
    from rlhfkit.accel.vocab import HeadProduct

    product = {"plain": vocab.PLAIN, "padded": PaddedProduct(), "onednn": HeadProduct()}[product]
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(3, 7, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(97, 16, generator=g, dtype=torch.float64) * 0.5
    labels = torch.randint(97, (3, 7), generator=g)
    w_lp, w_ent = torch.linspace(-1, 2, 21).view(3, 7), torch.linspace(0.5, -1, 21).view(3, 7)

    def run(fused: bool):
        h = hidden.clone().float().requires_grad_(True)
        w = weight.clone().float().requires_grad_(True)
        if fused:
            lp, ent = head_logprobs(h, w, labels, temperature, with_entropy=with_entropy, product=product)
        else:
            logits = (h.double() @ w.double().T) / temperature
            lp, ent = plain_logprobs(logits, labels), plain_entropy(logits) if with_entropy else None
        ((lp * w_lp).sum() + ((ent * w_ent).sum() if with_entropy else 0)).backward()
        return lp.double(), (ent.double() if with_entropy else 0), h.grad.double(), w.grad.double()

    fused = run(True)
    for got, want in zip(fused, run(False)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    lp, ent = head_logprobs(
        hidden.float(), weight.float(), labels, temperature, product=product
    )  # again: the kept blocks hold the last call's
    assert ent is None and torch.equal(lp.double(), fused[0])
    lp, _ = head_logprobs(
        hidden[:1].float(), weight.float(), labels[:1], temperature, with_entropy, product
    )  # fewer rows than a block
    torch.testing.assert_close(lp.double(), fused[0][:1].detach(), rtol=0, atol=1e-6)
    if isinstance(product, PaddedProduct):  # 21 rows in blocks of 3 padded to 4: 5 full blocks, the last 1 -> 4
        assert set(product.seen) == {4}


def test_kept_blocks_are_each_threads_own_and_a_training_run_frees_them(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import threading

    from tests.helpers import run_cli, sft_args, sft_rows, write_jsonl

    hidden, weight, labels = torch.randn(5, 16), torch.randn(400, 16), torch.randint(400, (5,))
    head_logprobs(hidden, weight, labels, with_entropy=True)
    mine = dict(vocab._KEPT.blocks)
    theirs = {}
    worker = threading.Thread(target=lambda: (head_logprobs(hidden, weight, labels), theirs.update(vocab._KEPT.blocks)))
    worker.start()
    worker.join()
    assert set(mine) == {0, 1} and theirs[0].data_ptr() != mine[0].data_ptr()  # no thread writes another's
    vocab.release_blocks()
    assert "blocks" not in vocab._KEPT.__dict__

    # an SFT run on the tiny model with the LM head taken block by block keeps blocks while it trains, and
    # frees them when it ends
    monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", 4 * 400)
    used, kept = [], vocab._kept
    monkeypatch.setattr(vocab, "_kept", lambda *a: used.append(a[0]) or kept(*a))
    data = write_jsonl(tmp_path / "sft.jsonl", sft_rows(8))
    code, _, _ = run_cli(capsys, *sft_args(tiny_model_dir, data, tmp_path / "out", max_steps=2, batch_size=4))
    assert code == 0 and used
    assert "blocks" not in vocab._KEPT.__dict__
