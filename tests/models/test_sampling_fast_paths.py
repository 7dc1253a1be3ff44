"""The sampler's fast paths give the plain loop's samples: shared prompt prefill (each distinct prompt run once,
its cache repeated to its rows) and the lean decode step (`rlhfkit.accel.decode`), on GPT-2, Llama and Qwen2
(grouped-query attention), with LoRA adapters, stopping once every row has stopped."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rlhfkit import accel
from rlhfkit.accel import decode as lean
from rlhfkit.config.parts import GenerationArgs, LoraArgs
from rlhfkit.models import sampling
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import apply_lora
from rlhfkit.models.sampling import cache_keyword, distinct_prompts, output_cache, sample_responses

from .test_architectures import make_config

TEXTS = ["Question: what does alice want? Answer:", "hi", "User: please give bob the hat\nAssistant:"]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def gpt2(tiny_model_dir, tok):
    return load_causal_lm(str(tiny_model_dir), tokenizer=tok)


def grpo_batch(tok, group: int = 4) -> list[list[int]]:
    """Each prompt ``group`` times, a group's rows contiguous, and one prompt again at the end (not adjacent)."""
    ids = [tok(t)["input_ids"] for t in TEXTS]
    return [p for p in ids for _ in range(group)] + [ids[0]]


def sample_with_logits(model, tok, prompts, args, seed, monkeypatch, share=True, lean_step=True):
    """``sample_responses``' responses and the LM head's last-position logits of every forward, ``[B, V]`` each
    (the shared prefill's ``[U, V]`` repeated to the rows)."""
    outputs = []
    head = sampling.base_model(model).get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, _i, out: outputs.append(out[:, -1].detach().clone()))
    # the lean step stands in for the model's forward while a command runs under --accel auto
    with accel.switched("auto") if lean_step else contextlib.nullcontext():
        try:
            torch.manual_seed(seed)
            got = sample_responses(model, tok, prompts, args, len(prompts), "cpu", share_prompts=share)
        finally:
            hook.remove()
    if share:
        _, rows = distinct_prompts(prompts)
        outputs[0] = outputs[0][torch.tensor(rows)]
    return got, outputs


def assert_same_sampling(a, b, atol: float = 1e-6):
    (got_a, logits_a), (got_b, logits_b) = a, b
    assert got_a == got_b
    assert len(logits_a) == len(logits_b) == max(len(r) for r in got_a)
    for x, y in zip(logits_a, logits_b):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=0, atol=atol)


def test_distinct_prompts():
    assert distinct_prompts([[1, 2], [1, 2], [3], [1, 2], [3], [4]]) == ([[1, 2], [3], [4]], [0, 0, 1, 0, 1, 2])
    assert distinct_prompts([[5], [6]]) == ([[5], [6]], [0, 1])


@pytest.mark.parametrize("lean_step", [False, True])
def test_shared_prompt_prefill_samples_what_one_prefill_per_row_samples(gpt2, tok, monkeypatch, lean_step):
    prompts = grpo_batch(tok)
    args = GenerationArgs(max_new_tokens=12, temperature=0.9, top_k=50, top_p=0.95)
    for seed in range(3):
        plain = sample_with_logits(gpt2, tok, prompts, args, seed, monkeypatch, share=False, lean_step=lean_step)
        shared = sample_with_logits(gpt2, tok, prompts, args, seed, monkeypatch, share=True, lean_step=lean_step)
        assert_same_sampling(shared, plain)
        assert len(set(map(tuple, shared[0][:4]))) > 1  # a group's rows differ: the draws are per row


def test_lean_step_is_used_where_it_applies(gpt2, monkeypatch):
    assert lean._supported(gpt2)
    hook = gpt2.register_forward_hook(lambda *_: None)
    assert not lean._supported(gpt2)  # a hook on the model's forward must see every step
    hook.remove()
    monkeypatch.setattr(gpt2, "forward", gpt2.forward)  # as an autocast wrapper replaces it
    assert not lean._supported(gpt2)
    monkeypatch.undo()
    assert lean._supported(gpt2)
    monkeypatch.setenv("RLHFKIT_ACCEL", "0")
    assert not lean._supported(gpt2)


def random_model(arch: str, tok):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(arch, len(tok), tok.eos_token_id))
    with torch.no_grad():  # larger than the default init, so attention scores are far from uniform
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.config.pad_token_id = tok.pad_token_id
    return model.eval()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_own_decode_loop_drives_decoder_only_models(arch, tok):
    """Not ``generate``'s fallback: the cache argument is found under the installed transformers' name."""
    model = random_model(arch, tok)
    assert sampling._loop_supported(model)
    assert cache_keyword(model) in ("cache", "past_key_values")


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_lean_step_samples_what_the_models_forward_samples(arch, tok, monkeypatch):
    model = random_model(arch, tok)
    assert lean._supported(model)
    prompts = grpo_batch(tok, group=3)
    args = GenerationArgs(max_new_tokens=20)
    for seed in range(2):
        fast = sample_with_logits(model, tok, prompts, args, seed, monkeypatch)
        plain = sample_with_logits(model, tok, prompts, args, seed, monkeypatch, share=False, lean_step=False)
        assert_same_sampling(fast, plain)


def with_random_adapters(model, r: int = 4):
    policy = apply_lora(model, LoraArgs(lora_r=r, lora_alpha=2 * r))
    with torch.no_grad():  # B starts at 0, which would make the adapters a no-op
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return policy


def test_lean_step_applies_lora_adapters(tiny_model_dir, tok, monkeypatch):
    policy = with_random_adapters(load_causal_lm(str(tiny_model_dir), tokenizer=tok))
    assert lean._supported(policy)
    prompts = grpo_batch(tok)
    args = GenerationArgs(max_new_tokens=12)
    fast = sample_with_logits(policy, tok, prompts, args, 0, monkeypatch)
    # compared at 1e-5 as the Llama / Qwen2 adapters below: the two paths sum in different orders (1.3e-6 seen)
    plain = sample_with_logits(policy, tok, prompts, args, 0, monkeypatch, lean_step=False)
    assert_same_sampling(fast, plain, 1e-5)
    with policy.disable_adapter():
        base = sample_with_logits(policy, tok, prompts, args, 0, monkeypatch)
    assert not torch.allclose(base[1][1], fast[1][1])  # the adapters changed the decode steps' logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_lora_projections_sample_what_peft_layers_sample(arch, tok, monkeypatch):
    """Llama / Qwen2 (grouped-query attention): the decode step computes each adapted projection itself
    (``lean_projection``), with the adapters' scaling folded into B, and samples what PEFT's layers sample."""
    policy = with_random_adapters(random_model(arch, tok))
    layer = lean.base_model(policy).model.layers[0]
    with torch.no_grad():
        for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            projection = lean.lean_projection(module)
            assert projection is not module
            x = torch.randn(3, 1, module.in_features)
            torch.testing.assert_close(projection(x), module(x), rtol=0, atol=1e-5)
            assert not torch.allclose(module.base_layer(x), module(x), atol=1e-3)  # the adapter counts
    prompts = grpo_batch(tok, group=3)
    args = GenerationArgs(max_new_tokens=16)
    fast = sample_with_logits(policy, tok, prompts, args, 0, monkeypatch)
    assert_same_sampling(fast, sample_with_logits(policy, tok, prompts, args, 0, monkeypatch, lean_step=False), 1e-5)
    with policy.disable_adapter():  # adapters off: the projections are the modules again, and the logits differ
        assert lean.lean_projection(layer.self_attn.q_proj) is layer.self_attn.q_proj
        base = sample_with_logits(policy, tok, prompts, args, 0, monkeypatch)
    assert not torch.allclose(base[1][1], fast[1][1])


def test_lean_lora_projection_merges_its_adapters_into_a_copy_on_the_cpu(tok, monkeypatch):
    """fp32 on the CPU, an adapted projection runs as one weight, W + s B A, built once per sampling call: the
    same outputs, the model's own weights untouched; in other dtypes the adapters' products run at each step."""
    policy = with_random_adapters(random_model("llama", tok))
    merged = []
    original = lean._merged_projection
    monkeypatch.setattr(lean, "_merged_projection", lambda *a: merged.append(a) or original(*a))
    module = lean.base_model(policy).model.layers[0].mlp.up_proj
    before = module.base_layer.weight.detach().clone()
    with torch.no_grad():
        x = torch.randn(3, 1, module.in_features)
        torch.testing.assert_close(lean.lean_projection(module)(x), module(x), rtol=0, atol=1e-5)
        assert len(merged) == 1 and torch.equal(module.base_layer.weight, before)
        module.to(torch.bfloat16)
        projection = lean.lean_projection(module)
        assert len(merged) == 1 and projection is not module
        torch.testing.assert_close(projection(x.bfloat16()), module(x.bfloat16()), rtol=0, atol=0.1)
    prompts = grpo_batch(tok, group=3)
    policy = with_random_adapters(random_model("qwen2", tok))
    args = GenerationArgs(max_new_tokens=12)
    fast = sample_with_logits(policy, tok, prompts, args, 0, monkeypatch)
    assert len(merged) > 1  # the sampler's decode steps ran merged projections
    assert_same_sampling(fast, sample_with_logits(policy, tok, prompts, args, 0, monkeypatch, lean_step=False), 1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_step_runs_weights_reordered_for_its_rows(arch, tok, monkeypatch):
    """fp32 on the CPU, the Llama / Qwen2 step runs every projection and the LM head through weights reordered
    once per sampling call for its row count (onednn.packed_linear), and samples what the model's forward does."""
    from rlhfkit.accel import onednn

    if not onednn.onednn_ready():
        pytest.skip("oneDNN's linear is not usable in this torch build")
    model = random_model(arch, tok)
    packed = []
    original = onednn.packed_linear
    monkeypatch.setattr(
        onednn, "packed_linear", lambda w, b, rows: packed.append((w.shape, rows)) or original(w, b, rows)
    )
    prompts = grpo_batch(tok, group=3)
    args = GenerationArgs(max_new_tokens=12)
    layers = lean.base_model(model).config.num_hidden_layers
    torch.manual_seed(0)
    with accel.switched("auto"):  # as a command samples
        sample_responses(model, tok, prompts, args, len(prompts), "cpu")
    assert len(packed) == 7 * layers + 1 and {rows for _, rows in packed} == {len(prompts)}  # 7 per layer, the head
    packed.clear()
    fast = sample_with_logits(model, tok, prompts, args, 0, monkeypatch)  # a hook on the head: it runs as a module
    assert len(packed) == 7 * layers
    assert_same_sampling(fast, sample_with_logits(model, tok, prompts, args, 0, monkeypatch, lean_step=False), 1e-5)


def test_packed_linear_equals_the_layer_and_applies_to_fp32_cpu_weights_only():
    from rlhfkit.accel import onednn

    if not onednn.onednn_ready():
        pytest.skip("oneDNN's linear is not usable in this torch build")
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40)
    for bias in (layer.bias, None):
        linear = onednn.packed_linear(layer.weight, bias, 16)
        for rows in (16, 5):  # the row count it was reordered for, and another
            x = torch.randn(rows, 1, 24)
            want = torch.nn.functional.linear(x, layer.weight, bias)
            torch.testing.assert_close(linear(x), want, rtol=0, atol=1e-5)
    assert onednn.packed_linear(layer.weight.bfloat16(), None, 16) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert onednn.packed_linear(layer.weight, None, 16) is None


def test_lean_loop_stops_once_every_row_has_stopped(gpt2, tok, monkeypatch):
    eos = tok.eos_token_id
    likely_eos = gpt2.get_output_embeddings().register_forward_hook(
        lambda _m, _i, out: out + 6.0 * torch.nn.functional.one_hot(torch.tensor(eos), out.shape[-1]).to(out.dtype)
    )
    try:
        args = GenerationArgs(max_new_tokens=30)
        for seed in range(3):
            got, logits = sample_with_logits(gpt2, tok, grpo_batch(tok), args, seed, monkeypatch)
            assert all(r[-1] == eos for r in got) and max(len(r) for r in got) < 30
            assert len(logits) == max(len(r) for r in got)  # one LM head call per sampled position, no more
            assert len({len(r) for r in got}) > 1  # rows stopped at different steps
    finally:
        likely_eos.remove()


def decode_steps(model, tok, prompts, steps: int, compiled: bool) -> list[torch.Tensor]:
    """The logits ``[B, V]`` of ``steps`` lean decode steps after a shared prefill, fed fixed tokens."""
    from transformers import DynamicCache

    from rlhfkit.data.collate import pad_with_mask

    distinct, rows = distinct_prompts(prompts)
    ids, mask = pad_with_mask(distinct, tok.pad_token_id, "left")
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        cache = output_cache(
            model(ids, attention_mask=mask, position_ids=positions, **{cache_keyword(model): DynamicCache()})
        )
        rows = torch.tensor(rows)
        decoder = lean.LeanDecoder(model, cache, rows, ids.shape[1] + steps, compiled=compiled)
        seen = torch.cat([mask[rows], torch.ones(len(rows), steps, dtype=mask.dtype)], 1).bool()
        position = positions[rows, -1:]
        tokens = torch.Generator().manual_seed(1)
        out = []
        for t in range(steps):
            position = position + 1
            token = torch.randint(len(tok), (len(rows), 1), generator=tokens)
            out.append(decoder.step(token, position, seen[:, : ids.shape[1] + t + 1]))
    return out


def test_compiled_step_runs_layers_swapped_to_onednn(tok, monkeypatch):
    """A real model's linears run through oneDNN (rlhfkit.accel.onednn); Inductor cannot lower that op for weights
    that change, so inside the compiled step they take the default path, and the logits are the eager step's."""
    from rlhfkit.accel import onednn

    if not onednn.onednn_ready():
        pytest.skip("oneDNN's fp32 linear is not usable in this torch build")
    monkeypatch.setattr(onednn, "ONEDNN_MIN_MACS", 0)  # the tiny model's products too
    model = random_model("llama", tok)
    assert onednn.fast_linears(model, measure=False) > 0
    prompts = grpo_batch(tok, group=2)
    for t_eager, t_compiled in zip(
        decode_steps(model, tok, prompts, 4, False), decode_steps(model, tok, prompts, 4, True)
    ):
        torch.testing.assert_close(t_compiled, t_eager, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_compiled_step_gives_the_eager_steps_logits_and_compiles_once(arch, tok):
    from torch._dynamo.utils import counters

    model = random_model(arch, tok)
    prompts = grpo_batch(tok, group=3)
    for t_eager, t_compiled in zip(
        decode_steps(model, tok, prompts, 6, False), decode_steps(model, tok, prompts, 6, True)
    ):
        torch.testing.assert_close(t_compiled, t_eager, rtol=0, atol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    shorter = [p[: len(p) - 2] or p for p in prompts]  # another prompt width, the same capacity bucket
    for t_eager, t_compiled in zip(
        decode_steps(model, tok, shorter, 6, False), decode_steps(model, tok, shorter, 6, True)
    ):
        torch.testing.assert_close(t_compiled, t_eager, rtol=0, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs  # no recompilation from step to step or batch to batch
