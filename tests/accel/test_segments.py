"""Attention by segments on packed rows (rlhfkit/accel/segments.py): the same outputs and gradients as the fused
attention under the packed mask, used by packed forwards where it is cheaper, and not where it could not be."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.accel import segments
from rlhfkit.accel.packing import pack_batch

from .test_packing import PAD, always_pack, assert_packed_matches_padded, causal_lm, grouped_batch  # noqa: F401


@pytest.fixture
def always_segments(monkeypatch):
    """Use segments whatever they cover (the tests' rows are too short to save anything)."""
    monkeypatch.setattr(segments, "MAX_COVER", 1e9)


@pytest.mark.usefixtures("always_segments")
def test_segments_attend_as_the_masked_attention(monkeypatch):
    """On a real packed layout (a shared head, prompts shared by groups of completions, free positions): every
    used position's output and the gradients of queries, keys and values equal the masked fused attention's,
    with grouped keys / values; free positions give zeros. Segments cut at 4 queries."""
    monkeypatch.setattr(segments, "SEGMENT_QUERIES", 4)
    model = causal_lm("llama", "sdpa")
    ids, mask, P, _, _ = grouped_batch(4, groups=3, group_size=4, common=4)
    packed = pack_batch(model, ids, mask, PAD, prompt_width=P)
    R, C = packed.input_ids.shape
    used = torch.zeros(R * C, dtype=torch.bool)
    used[packed.index.flatten()] = True
    used = used.view(R, C)
    assert not used.all(), "the layout should have free positions"
    plan = segments.plan(packed.allowed, used)
    assert plan is not None and plan.queries.shape[1] == 4
    H, Hkv, D = 6, 2, 8
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(R, H, C, D, generator=gen, requires_grad=True)
    k = torch.randn(R, Hkv, C, D, generator=gen, requires_grad=True)
    v = torch.randn(R, Hkv, C, D, generator=gen, requires_grad=True)
    weight = torch.randn(R, C, H, D, generator=gen) * used[:, :, None, None]
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=packed.allowed, scale=0.3, enable_gqa=True)
    fused = fused.transpose(1, 2)
    ours = segments.attend(plan, q, k, v, 0.3)
    assert torch.allclose(ours[used], fused[used], atol=1e-6)
    assert not ours[~used].any()
    want = torch.autograd.grad((fused * weight).sum(), (q, k, v))
    got = torch.autograd.grad((ours * weight).sum(), (q, k, v))
    for a, b in zip(want, got):
        assert torch.allclose(a, b, atol=1e-5)


def test_one_long_sequence_per_row_keeps_the_fused_attention():
    """Segments of one causal sequence would cover its whole score matrix: not cheaper, not used."""
    C = 64
    allowed = torch.ones(C, C, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)
    assert segments.plan(allowed, torch.ones(2, C, dtype=torch.bool)) is None


@pytest.mark.usefixtures("always_pack", "always_segments")
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_packed_forwards_attend_by_segments(monkeypatch, arch):
    """The packed forward of a GRPO-like batch runs its attention by segments, in every layer of every pass, and
    gives the padded forward's outputs and gradients; with gradient checkpointing it keeps the fused attention."""
    calls = []
    attend = segments.attend
    monkeypatch.setattr(segments, "attend", lambda *a: calls.append(1) or attend(*a))
    policy = causal_lm(arch, "sdpa")
    ids, mask, P, T, _ = grouped_batch(5, groups=2, group_size=6, common=3)
    packed = pack_batch(policy, ids, mask, PAD, prompt_width=P)
    assert_packed_matches_padded(policy, ids, mask, T, packed)
    assert len(calls) == 2 * policy.config.num_hidden_layers  # the actor-critic's pass and the reference's
    calls.clear()
    policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.train()  # checkpointing runs in training mode only; dropout off, to compare
    for module in policy.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    assert_packed_matches_padded(policy, ids, mask, T, packed)
    assert not calls


@pytest.mark.usefixtures("always_pack")
def test_packed_rows_without_segments_read_grouped_keys_in_place(monkeypatch):
    """Where segments do not pay off, the packed forward attends over its whole rows with the key / value heads
    read by their query heads' groups, not copied out per query head: the padded forward's outputs and
    gradients, and for backward exactly those copies' bytes fewer kept than transformers' own sdpa path."""
    monkeypatch.setattr(segments, "MAX_COVER", 0.0)  # never segments
    calls = []
    whole = segments.whole_rows
    monkeypatch.setattr(segments, "whole_rows", lambda *a: calls.append(1) or whole(*a))
    policy = causal_lm("llama", "sdpa")
    cfg = policy.config
    ids, mask, P, T, _ = grouped_batch(7, groups=2, group_size=5, common=3)
    packed = pack_batch(policy, ids, mask, PAD, prompt_width=P)
    assert packed.segment_plan is None
    assert_packed_matches_padded(policy, ids, mask, T, packed)
    assert len(calls) == 2 * cfg.num_hidden_layers  # the actor-critic's pass and the reference's

    def saved_bytes() -> int:
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            packed.run(policy.model).last_hidden_state.sum().backward()
        return sum(seen.values())

    ours = saved_bytes()
    monkeypatch.setattr(type(packed), "_attention", lambda self, model: contextlib.nullcontext())
    stock = saved_bytes()
    R, C = packed.input_ids.shape
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    extra_heads = cfg.num_attention_heads - cfg.num_key_value_heads
    copies = 2 * R * extra_heads * C * head_dim * 4  # keys and values beyond their own heads, fp32
    assert extra_heads > 0 and stock - ours == cfg.num_hidden_layers * copies
