"""The fused-activation swap computes the same function, forward and backward, and saves nothing new."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rlhfkit.accel.kernels import TanhGELU, fuse_activations
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
