"""The kernel swaps compute the same function, forward and backward: the fused tanh-GELU, the SwiGLU MLP and the
in-place LoRA sum."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.accel.kernels import TanhGELU, fuse_activations
from rlhfkit.accel.trainable import fuse_lora_linears
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import save_pretrained


def test_tanh_gelu_matches_the_elementwise_formula():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64, requires_grad=True)
    want = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    got = TanhGELU()(x)
    assert torch.allclose(got, want, atol=1e-12)
    (g_want,) = torch.autograd.grad(want.sum(), x)
    (g_got,) = torch.autograd.grad(got.sum(), x)
    assert torch.allclose(g_got, g_want, atol=1e-12)


def test_loaded_gpt2_is_fused_and_agrees_with_the_plain_model(tiny_model_dir, tmp_path):
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert plain.config.activation_function == "gelu_new"
    ours = load_causal_lm(str(tiny_model_dir))
    assert sum(isinstance(m, TanhGELU) for m in ours.modules()) == plain.config.n_layer
    assert fuse_activations(ours) == 0  # nothing left to replace
    ids = torch.randint(0, plain.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    a, b = plain(input_ids=ids).logits, ours(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5)
    a.logsumexp(-1).mean().backward()
    b.logsumexp(-1).mean().backward()
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name
    # the swap is in memory only: a saved copy is a plain gpt2 with the same weights and config
    save_pretrained(ours, load_tokenizer(str(tiny_model_dir)), tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert again.config.activation_function == "gelu_new"
    assert torch.allclose(again(input_ids=ids).logits, a, atol=1e-5)


def _llama(tied: bool):
    from transformers import AutoModelForCausalLM

    from ..models.test_architectures import make_config

    config = make_config("llama", 97, 0)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _same_logits_and_gradients(plain, ours, ids) -> None:
    """The two models give equal logits and, after the same loss's backward, equal gradients, bit for bit."""
    a, b = plain(input_ids=ids).logits, ours(input_ids=ids).logits
    assert torch.equal(a, b)
    a.pow(2).mean().backward()
    b.pow(2).mean().backward()
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_lora_linears_add_the_adapters_in_place_as_peft_does(monkeypatch):
    """The swapped LoRA layers give PEFT's outputs and gradients (adapters, inputs); with dropout on the adapters'
    input, adapters off or merged they run PEFT's own forward."""
    import copy

    from peft import LoraConfig, get_peft_model

    from rlhfkit.config.parts import LoraArgs
    from rlhfkit.models.lora import apply_lora

    base = _llama(tied=True)
    plain = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    ours = apply_lora(copy.deepcopy(base), LoraArgs(lora_r=4, lora_alpha=8))
    fused = [m for m in ours.modules() if type(m).__name__ == "FusedLinear"]
    assert len(fused) == 7 * 2 and fuse_lora_linears(ours) == 0
    for p in plain.parameters():
        if p.requires_grad:
            p.data.normal_(0, 0.2, generator=torch.Generator().manual_seed(p.numel()))  # B away from zero
    ours.load_state_dict(plain.state_dict())
    calls = []
    for m in fused:
        m.base_layer.register_forward_hook(lambda *a: calls.append(1))
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    a, b = plain(input_ids=ids).logits, ours(input_ids=ids).logits
    assert len(calls) == len(fused) and torch.allclose(a, b, atol=1e-5)
    a.pow(2).mean().backward()
    b.pow(2).mean().backward()
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name
    with ours.disable_adapter(), plain.disable_adapter(), torch.no_grad():
        assert torch.allclose(ours(input_ids=ids).logits, base(input_ids=ids).logits, atol=1e-5)
    adds = []
    addmm = torch.Tensor.addmm_
    monkeypatch.setattr(torch.Tensor, "addmm_", lambda self, *a, **k: adds.append(1) or addmm(self, *a, **k))
    with torch.no_grad():
        ours(input_ids=ids)
        assert len(adds) == len(fused)
        for m in fused:
            m.lora_dropout["default"] = torch.nn.Dropout(0.5)
        ours.eval()(input_ids=ids)  # dropout modules, even in eval: PEFT's forward
    assert len(adds) == len(fused)


def _saved_bytes(mlp) -> int:
    """The bytes an MLP's forward keeps for backward on 64 rows (each storage once)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(64, mlp.hidden_size, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mlp(x).sum().backward()
    return sum(seen.values())


@pytest.mark.parametrize("via_onednn", [False, True])
def test_swiglu_mlp_is_the_model_mlp_bit_for_bit_and_keeps_two_tensors_less(monkeypatch, via_onednn):
    """With plain linear layers and with their oneDNN swap: the same logits and gradients, and neither
    ``silu(gate)`` nor ``silu(gate) * up`` (the down projection's input) kept for backward."""
    import copy

    from rlhfkit.accel import onednn
    from rlhfkit.accel.kernels import fuse_swiglu_mlps
    from rlhfkit.accel.onednn import fast_linears

    plain = _llama(tied=False)
    if via_onednn:
        if not onednn.onednn_ready():
            pytest.skip("oneDNN's fp32 linear is not usable here")
        monkeypatch.setattr(onednn, "ONEDNN_MIN_MACS", 0)  # the tiny model's products take it too
        assert fast_linears(plain, measure=False) > 0
    ours = copy.deepcopy(plain)
    assert fuse_swiglu_mlps(ours) == 2  # one per layer
    assert fuse_swiglu_mlps(ours) == 0
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(2))
    _same_logits_and_gradients(plain, ours, ids)
    with torch.no_grad():  # the in-place product of the no-grad path
        assert torch.equal(plain(input_ids=ids).logits, ours(input_ids=ids).logits)
    inter = plain.config.intermediate_size
    saved = _saved_bytes(plain.model.layers[0].mlp) - _saved_bytes(ours.model.layers[0].mlp)
    assert saved == 2 * 64 * inter * 4  # silu(gate) and silu(gate) * up are not kept


def test_swiglu_mlp_keeps_the_down_projections_input_where_it_is_not_a_plain_linear():
    """A down projection with adapters (or any module other than a plain linear) runs as it is, on the product."""
    from peft import LoraConfig, get_peft_model

    from rlhfkit.accel.kernels import fuse_swiglu_mlps

    model = get_peft_model(_llama(tied=False), LoraConfig(r=4, lora_alpha=8, target_modules=["down_proj"]))
    assert fuse_swiglu_mlps(model) == 2
    mlp = model.base_model.model.model.layers[0].mlp
    calls = []
    mlp.down_proj.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    inter = mlp.intermediate_size
    # gate(x), up(x), the product (kept by the adapter's and the base layer's linears), the adapter's rank-4 output
    assert _saved_bytes(mlp) >= 3 * 64 * inter * 4
    assert calls == [torch.Size([64, inter])]


def test_swiglu_mlp_leaves_other_activations_and_hooked_ones_alone():
    from torch import nn

    from rlhfkit.accel.kernels import fuse_swiglu_mlps

    model = _llama(tied=False)
    model.model.layers[0].mlp.act_fn = nn.GELU()
    assert fuse_swiglu_mlps(model) == 1
    seen = []
    mlp = model.model.layers[1].mlp
    mlp.act_fn.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert seen == [torch.Size([1, 3, model.config.intermediate_size])]  # the hooked activation still ran
