"""fp32 CPU linear layers through oneDNN (rlhfkit/accel/onednn.py): the same products as the default path,
forward and backward, with the row count padded to a bounded set of sizes; the default path wherever the
oneDNN one does not apply."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from rlhfkit.accel import onednn, passes, vocab
from rlhfkit.accel.onednn import OneDNNLinear, fast_linears, linear_matmul, padded_rows

needs_onednn = pytest.mark.skipif(not onednn._onednn_available(), reason="this torch build has no oneDNN linear")


@pytest.fixture
def count_onednn_calls(monkeypatch):
    """Route fp32 linears through oneDNN whatever the load-time timing decides on this CPU, and count calls."""
    monkeypatch.setattr(onednn, "_ONEDNN", True)
    monkeypatch.setattr(onednn, "onednn_faster", lambda in_features, out_features, backward=False: True)
    calls = []
    original = onednn._OneDNNMatmul.apply
    monkeypatch.setattr(onednn._OneDNNMatmul, "apply", lambda *a: calls.append(a[0].shape) or original(*a))
    monkeypatch.setattr(onednn, "ONEDNN_MIN_MACS", 1)  # these test shapes are small
    return calls


def test_padded_rows_are_a_bounded_set_of_sizes_at_most_an_eighth_larger():
    for m in range(1, 5000):
        p = padded_rows(m)
        assert m <= p <= max(m + 7, m * 9 // 8)
    assert len({padded_rows(m) for m in range(1025, 2049)}) == 8  # 8 sizes per power of two
    assert padded_rows(704) == 704 and padded_rows(650) == 704


@needs_onednn
@pytest.mark.parametrize("layer", ["linear", "linear-no-bias", "conv1d"])
@pytest.mark.parametrize("shape", [(37, 24), (3, 50, 24)])  # rows not a padded size; 2-D and 3-D input
def test_swapped_layer_equals_the_default_forward_and_backward(count_onednn_calls, layer, shape):
    torch.manual_seed(0)
    plain = {"linear": nn.Linear(24, 40), "linear-no-bias": nn.Linear(24, 40, bias=False), "conv1d": Conv1D(40, 24)}[
        layer
    ]
    if layer == "conv1d":
        nn.init.normal_(plain.bias)
    ours = copy.deepcopy(plain)
    assert fast_linears(ours) == 1
    x = torch.randn(*shape, dtype=torch.float32)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = plain(xa), ours(xb)
    assert count_onednn_calls, "the oneDNN path was not taken"
    assert b.shape == a.shape and torch.allclose(b, a, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(a)
    (a * weights).sum().backward()
    (b * weights).sum().backward()
    assert torch.allclose(xb.grad, xa.grad, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert torch.allclose(q.grad, p.grad, atol=1e-4, rtol=1e-5), name
    assert list(ours.state_dict()) == list(plain.state_dict())


@needs_onednn
def test_default_path_under_autocast_other_dtypes_and_small_products(count_onednn_calls, monkeypatch):
    layer = OneDNNLinear(24, 40)
    x = torch.randn(37, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16  # autocast's bf16 matmul, not ours
    assert layer.double()(x.double()).dtype == torch.float64
    assert not count_onednn_calls
    monkeypatch.setattr(onednn, "ONEDNN_MIN_MACS", 10**9)
    assert linear_matmul(x, torch.randn(24, 40), None) is None  # too small to pay for a oneDNN call


def test_switch_off_by_environment(monkeypatch, tiny_model_dir):
    from rlhfkit.accel import enabled, prepare_model
    from rlhfkit.models.loading import load_causal_lm

    monkeypatch.setenv("RLHFKIT_ACCEL", "0")
    assert not enabled()
    assert not any(prepare_model(nn.Sequential(nn.Linear(4, 4))).values())
    model = load_causal_lm(str(tiny_model_dir))
    assert any(type(m) is Conv1D for m in model.modules()), (
        "the switch leaves loaded models as transformers builds them"
    )


@needs_onednn
def test_loaded_model_uses_it_and_matches_the_plain_model(tiny_model_dir, count_onednn_calls):
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.loading import load_causal_lm

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ours = load_causal_lm(str(tiny_model_dir))
    assert not any(type(m) in (nn.Linear, Conv1D) for m in ours.modules())
    ids = torch.randint(0, plain.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    a, b = plain(input_ids=ids).logits, ours(input_ids=ids).logits
    assert count_onednn_calls
    assert torch.allclose(a, b, atol=1e-5)
    a.logsumexp(-1).mean().backward()
    b.logsumexp(-1).mean().backward()
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name


@needs_onednn
def test_backward_keeps_the_unpadded_input_not_a_padded_copy(count_onednn_calls):
    layer = OneDNNLinear(24, 40)
    x = torch.randn(37, 24, requires_grad=True)  # 37 rows run as padded_rows(37) = 40
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = layer(x)
    assert count_onednn_calls and padded_rows(37) == 40
    rows = sorted(t.shape[0] for t in saved if t.ndim == 2 and t.shape[1] == 24)
    assert rows == [37], "the input held for backward should be the 37 real rows"
    y.sum().backward()
    assert torch.allclose(x.grad, layer.weight.sum(0).expand(37, 24), atol=1e-5)


@needs_onednn
def test_layers_are_swapped_only_where_onednn_is_faster_at_their_shape(monkeypatch, tmp_path):
    from rlhfkit.accel import prepare_model

    monkeypatch.setattr(onednn, "_FASTER", {})
    monkeypatch.setenv("RLHFKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(onednn, "SELF_CHECK_SPEEDUP", 1e9)  # no kernel is that much faster: keep the default
    model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))
    assert prepare_model(model)["onednn_linear"] == 0 and all(type(m) is nn.Linear for m in model)
    assert onednn._FASTER and not any(onednn._FASTER.values())
    monkeypatch.setattr(onednn, "SELF_CHECK_SPEEDUP", 0.0)  # any time counts as faster now, but shapes are
    assert prepare_model(nn.Sequential(nn.Linear(256, 512)))["onednn_linear"] == 0  # timed once per process
    assert prepare_model(nn.Sequential(nn.Linear(256, 384)))["onednn_linear"] == 1  # a new shape is timed
    assert not onednn.onednn_faster(24, 40)  # too small a product for the oneDNN path at all
    # the verdicts are kept on disk: a new process (an empty in-memory table) reads them instead of timing
    saved = json.loads(onednn.decisions_file().read_text())
    shapes, kinds = ("256x512", "512x256", "256x384"), ("forward", "train")
    assert saved == {f"{shape}@1 {kind}": shape == "256x384" for shape in shapes for kind in kinds}
    monkeypatch.setattr(onednn, "_FASTER", {})
    monkeypatch.setattr(onednn, "_time_shape", lambda *a: pytest.fail("timed again"))
    assert onednn.onednn_faster(256, 384) and not onednn.onednn_faster(256, 512, backward=True)


@needs_onednn
def test_a_layer_takes_onednn_with_and_without_gradients_as_its_two_verdicts_say(monkeypatch, count_onednn_calls):
    """Where oneDNN won the forward timing but lost forward-and-backward, the layer's products without gradients
    (sampling, scoring) take it and those of a training step do not; the results agree either way."""
    monkeypatch.setattr(onednn, "onednn_faster", lambda in_features, out_features, backward=False: not backward)
    layer = nn.Linear(64, 96)
    reference = nn.Linear(64, 96)
    reference.load_state_dict(layer.state_dict())
    assert fast_linears(layer) == 1 and layer.onednn_forward and not layer.onednn_training
    x = torch.randn(50, 64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), reference(x), rtol=1e-5, atol=1e-5)
    assert count_onednn_calls == [(50, 64)]
    y = layer(x.requires_grad_())
    y.sum().backward()
    assert count_onednn_calls == [(50, 64)]  # the training product took PyTorch's path
    torch.testing.assert_close(y, reference(x), rtol=1e-5, atol=1e-5)
    # packing widens rows to oneDNN's row counts only for the passes whose products take it
    with torch.no_grad():
        assert onednn.onednn_layers(layer)
    assert not onednn.onednn_layers(layer)
    # a layer swapped without measuring takes oneDNN both ways
    both = nn.Linear(64, 96)
    assert fast_linears(both, measure=False) == 1
    both(x).sum().backward()
    assert len(count_onednn_calls) == 2


def test_verdicts_are_kept_per_cpu_instruction_set(monkeypatch, tmp_path):
    """One CPU model name covers machines with and without AVX-512, where the faster kernel differs: their
    verdicts go to different files."""
    monkeypatch.setenv("RLHFKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(onednn, "_cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(onednn, "_cpu_isa", lambda: "AVX2")
    avx2 = onednn.decisions_file()
    monkeypatch.setattr(onednn, "_cpu_isa", lambda: "AVX512+avx512f")
    assert onednn.decisions_file() != avx2 and onednn.decisions_file().parent == avx2.parent == tmp_path


@needs_onednn
def test_the_first_verdict_written_for_a_shape_is_every_later_processs(monkeypatch, tmp_path):
    """Processes that time the same shape at once keep the first verdict on file (a second timing that came
    out the other way adopts it), and no process's verdict for another shape is lost."""
    import multiprocessing

    monkeypatch.setenv("RLHFKIT_CACHE_DIR", str(tmp_path))
    assert onednn._write_decision("64x64@1", True) is True
    assert onednn._write_decision("64x64@1", False) is True  # the later, opposite timing adopts the kept one
    keys = [f"{n}x{n}@1" for n in range(100, 140)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        pool.starmap(onednn._write_decision, [(k, i % 2 == 0) for i, k in enumerate(keys)])
    saved = json.loads(onednn.decisions_file().read_text())
    assert saved == {"64x64@1": True, **{k: i % 2 == 0 for i, k in enumerate(keys)}}


def test_a_swapped_lm_head_takes_its_block_products_through_onednn(count_onednn_calls, monkeypatch):
    """At a vocabulary above one block the LM head's log-probs run block by block; a head swapped to oneDNN
    runs those blocks' products through it (HeadProduct), padded to its row sizes, with the plain values."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.models import forward

    from ..models.test_architectures import make_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config("llama", 64, 1)).eval()
    head = model.get_output_embeddings()
    assert passes.fused_head(model, 10**9)[2] is vocab.PLAIN  # not swapped: the default products
    fast_linears(model)
    assert isinstance(head, OneDNNLinear) and isinstance(vocab.head_product(head), vocab.HeadProduct)
    assert vocab.head_product(nn.Linear(4, 8, bias=False)) is None
    monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", 5 * head.out_features)  # 5 positions a block
    used = []
    original = vocab.HeadProduct.mm
    monkeypatch.setattr(
        vocab.HeadProduct, "mm", lambda self, a, b, slot: used.append(a.shape[0]) or original(self, a, b, slot)
    )
    ids = torch.randint(head.out_features, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    lp, _, _ = forward.response_token_stats(model, ids, mask, 6)
    assert used and set(used) == {padded_rows(5)}  # 18 positions in blocks of 5, each padded to 8
    logits = model(input_ids=ids, attention_mask=mask, position_ids=forward.position_ids(mask)).logits
    want = torch.log_softmax(logits[:, -7:-1].float(), -1).gather(-1, ids[:, -6:, None]).squeeze(-1)
    torch.testing.assert_close(lp, want, rtol=0, atol=1e-5)
