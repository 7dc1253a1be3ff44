"""Sequence packing (rlhfkit/models/packing.py): the packed forward must give the padded forward's outputs and
gradients on every real token, for each architecture it is enabled for and both attention kernels."""

from __future__ import annotations

import contextlib
import random
from unittest import mock

import pytest
import torch

from rlhfkit import accel
from rlhfkit.accel import onednn, packing, passes
from rlhfkit.accel.packing import can_pack, pack_batch, plan_rows
from rlhfkit.models.forward import response_logprobs
from rlhfkit.trainers.online.policy import ActorCritic, SeparateValueModel

from ..models.test_architectures import make_config

VOCAB, EOS, PAD = 96, 0, 1


def ragged_batch(seed: int, rows: int = 7):
    """[left-padded prompt | right-padded response] ids and mask, lengths all different."""
    rng = random.Random(seed)
    prompts = [rng.randint(1, 9) for _ in range(rows)]
    responses = [rng.randint(1, 12) for _ in range(rows)]
    P, T = max(prompts), max(responses)
    ids = torch.full((rows, P + T), PAD)
    mask = torch.zeros(rows, P + T, dtype=torch.long)
    for i, (p, t) in enumerate(zip(prompts, responses)):
        ids[i, P - p : P + t] = torch.tensor([rng.randrange(2, VOCAB) for _ in range(p + t)])
        mask[i, P - p : P + t] = 1
    return ids, mask, T


def causal_lm(arch: str, attn: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_config(arch, VOCAB, EOS), attn_implementation=attn).eval()


@pytest.fixture
def always_pack(monkeypatch):
    """Make attention look free to the planner, so it packs as many sequences per row as fit."""
    monkeypatch.setattr(packing, "SPAN_PER_HIDDEN", 10**6)


def packing_on(on: bool):
    """Run as a command does with ``--pack-sequences`` on or off (``--accel auto``)."""
    return accel.switched("auto", options={"pack_sequences": on})


def padded_then_packed(model, run) -> list[tuple[torch.Tensor, dict]]:
    """``run()`` -> output ``[N]`` (or a scalar), with packing off, then on; each way, backpropagate a fixed
    weighting of it and return (output, gradient of every weight): ``[padded, packed]``."""
    results = []
    for pack_sequences in (False, True):
        model.zero_grad()
        with packing_on(pack_sequences):
            out = run()
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append((out.detach(), {n: w.grad.clone() for n, w in model.named_parameters() if w.grad is not None}))
    return results


def assert_same_gradients(results) -> None:
    (_, padded), (_, packed) = results
    for name, g in padded.items():
        assert torch.allclose(g, packed[name], atol=2e-5, rtol=1e-4), name


def test_plan_places_every_sequence_once_and_saves_positions():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(3, 50) for _ in range(rng.randint(2, 40))]
        rows = plan_rows(lengths, 60, hidden_size=384)
        if rows is None:
            continue
        assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
        width = max(sum(lengths[i] for i in row) for row in rows)
        assert len(rows) * width < len(lengths) * 60  # fewer positions than the padded batch
    assert plan_rows([20] * 16, 20, hidden_size=384) is None  # no padding: nothing to gain
    rows = plan_rows([48, 10, 40, 12, 45, 6, 30, 20], 50, hidden_size=384)
    assert rows is not None and len(rows) < 8


def test_row_width_is_exact_in_fp32_and_a_multiple_of_8_in_16_bit(always_pack):
    """fp32 rows are as wide as their longest load (no wasted positions); in 16-bit compute (autocast or
    16-bit weights) they are rounded up to ROW_MULTIPLE, so a run meets only a few distinct shapes."""
    ids, mask, _ = ragged_batch(3, rows=9)
    policy = causal_lm("gpt2", "sdpa")

    def widths(model):
        p = pack_batch(model, ids, mask, PAD)
        loads = torch.zeros(p.input_ids.numel(), dtype=torch.long)
        loads[p.index[mask.bool()]] = 1
        return p.input_ids.shape[1], int(loads.view(p.input_ids.shape).sum(1).max())

    width, longest = widths(policy)
    assert width == longest and width % packing.ROW_MULTIPLE != 0  # this batch's longest load is not a multiple of 8
    with torch.autocast("cpu", dtype=torch.bfloat16):
        width16, longest16 = widths(policy)
    assert width16 % packing.ROW_MULTIPLE == 0 and longest16 <= width16 < longest16 + packing.ROW_MULTIPLE
    assert widths(policy.to(torch.bfloat16))[0] % packing.ROW_MULTIPLE == 0


@pytest.mark.skipif(not onednn._onednn_available(), reason="this torch build has no oneDNN linear")
def test_rows_widen_to_a_size_the_onednn_layers_take_unpadded(always_pack, monkeypatch):
    """With linear layers swapped to oneDNN (which pad their input to ``padded_rows`` rows), the packed rows are
    made a few positions wider where that makes the packed positions such a size; the outputs and gradients
    stay the padded batch's."""
    monkeypatch.setattr(onednn, "_ONEDNN", True)
    monkeypatch.setattr(onednn, "ONEDNN_MIN_MACS", 1)  # these test shapes are small
    ids, mask, T = ragged_batch(3, rows=9)
    policy = causal_lm("llama", "sdpa")
    exact = pack_batch(policy, ids, mask, PAD).input_ids.shape
    assert onednn.fast_linears(policy, measure=False) > 0 and onednn.onednn_layers(policy)
    packed = pack_batch(policy, ids, mask, PAD)
    R, width = packed.input_ids.shape
    assert R == exact[0] and onednn.padded_rows(R * exact[1]) != R * exact[1]  # this batch needs the widening
    assert width > exact[1] and R * width == onednn.padded_rows(R * exact[1])
    assert_packed_matches_padded(policy, ids, mask, T)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn.onednn_layers(policy)  # 16-bit compute takes the default path


def test_packed_rows_keep_sequences_apart(always_pack):
    ids, mask, T = ragged_batch(1)
    packed = pack_batch(causal_lm("gpt2", "sdpa"), ids, mask, PAD)
    assert packed.input_ids.shape[0] < ids.shape[0]  # several sequences share rows
    real = packed.index[mask.bool()]
    assert len(set(real.tolist())) == int(mask.sum())  # each real token has its own packed position
    assert torch.equal(packed.input_ids.flatten()[real], ids[mask.bool()])
    assert torch.equal(packed.position_ids.flatten()[real], (mask.cumsum(1) - 1)[mask.bool()])
    # A token may attend to an earlier token exactly when both belong to the same sequence.
    owner = torch.full((packed.input_ids.numel(),), -1)
    owner[real] = torch.arange(len(mask)).repeat_interleave(mask.sum(1))
    allowed = packed.allowed[:, 0]
    for r in range(allowed.shape[0]):
        o = owner.view(packed.input_ids.shape)[r]
        same = (o[:, None] == o[None, :]) & (o[:, None] >= 0)
        assert torch.equal(allowed[r] & (o[:, None] >= 0), same & torch.ones_like(same).tril())


def test_packed_sequences_do_not_see_each_other(always_pack):
    """Changing every token of one sequence leaves the packed outputs of all the others unchanged, for
    each sequence in turn (whatever its place in its row)."""
    policy = causal_lm("llama", "sdpa")
    ids, mask, T = ragged_batch(6)
    real = mask.bool()

    def real_logits(x):
        p = pack_batch(policy, x, mask, PAD)
        assert p.input_ids.shape[0] < x.shape[0]
        flat = policy(**p.model_inputs(policy)).logits
        return flat.reshape(-1, VOCAB)[p.index[real]]  # [N, V] real tokens, sequence by sequence

    base = real_logits(ids)
    owner = torch.arange(len(mask)).repeat_interleave(mask.sum(1))  # [N] sequence of each real token
    for b in range(len(mask)):
        changed = ids.clone()
        changed[b][real[b]] = (changed[b][real[b]] + 7) % (VOCAB - 2) + 2
        out = real_logits(changed)
        assert torch.equal(out[owner != b], base[owner != b]), b  # bit for bit: nothing crosses sequences
        assert not torch.allclose(out[owner == b], base[owner == b])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2", "gpt_neox"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_equals_padded_forward(always_pack, arch, attn):
    """Log-probs, values (value head on the policy) and entropies, and the gradients of all weights."""
    policy = causal_lm(arch, attn)
    assert can_pack(policy)
    ids, mask, T = ragged_batch(2)
    packed = pack_batch(policy, ids, mask, PAD, prompt_width=ids.shape[1] - T)
    assert packed.input_ids.numel() < ids.numel()
    assert_packed_matches_padded(policy, ids, mask, T)


def assert_packed_matches_padded(policy, ids, mask, T: int) -> None:
    """An actor-critic on ``policy`` (a value head that is not all zeros): log-probs, values, entropies, every
    weight's gradient and the no-grad reference log-probs are the same padded and packed (and packed they are)."""
    ac = ActorCritic(policy)
    torch.nn.init.normal_(ac.value_head.linear.weight, std=0.1)
    response_mask = mask[:, -T:].float()
    outputs, grads, ref, packs = [], [], [], []
    real_pack = passes.pack_batch
    for on in (False, True):
        ac.zero_grad()
        with (
            packing_on(on),
            mock.patch.object(passes, "pack_batch", lambda *a: packs.append(real_pack(*a)) or packs[-1]),
        ):
            out = ac(ids, mask, T, 0.7, True)
            sum(((o * response_mask) * torch.linspace(0.5, 1.5, T)).sum() for o in out).backward()
            ref.append(response_logprobs(policy, ids, mask, T, 0.7) * response_mask)
        outputs.append([o * response_mask for o in out])
        grads.append({n: w.grad.clone() for n, w in ac.named_parameters() if w.grad is not None})
    assert len(packs) == 1 and packs[0] is not None  # packed once, the reference's pass on the same packing
    for padded, packed_out in zip(*outputs):
        assert torch.allclose(padded, packed_out, atol=2e-5), float((padded - packed_out).abs().max())
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=2e-5, rtol=1e-4), name
    assert torch.allclose(ref[0], ref[1], atol=2e-5)


def test_packed_separate_value_model(always_pack):
    from transformers import AutoModelForSequenceClassification

    config = make_config("gpt2", VOCAB, EOS)
    config.num_labels, config.pad_token_id = 1, PAD
    torch.manual_seed(1)
    value = SeparateValueModel(AutoModelForSequenceClassification.from_config(config).eval())
    ids, mask, T = ragged_batch(3)
    assert pack_batch(value.backbone, ids, mask, PAD, prompt_width=ids.shape[1] - T) is not None
    m = mask[:, -T:].float()
    with packing_on(False):
        padded = value(ids, mask, T) * m
    with packing_on(True):
        assert torch.allclose(padded, value(ids, mask, T) * m, atol=2e-5)


def test_packing_is_off_where_it_could_change_results():
    assert not can_pack(_bloom())  # ALiBi biases come from the 2-D mask: not in the allow-list
    qwen = causal_lm("qwen2", "sdpa")
    qwen.config.use_sliding_window, qwen.config.sliding_window = True, 4
    ids, mask, _ = ragged_batch(4)
    assert pack_batch(qwen, ids, mask, PAD) is None  # a sequence longer than the window would lose the window


def _bloom():
    from transformers import AutoModelForCausalLM, BloomConfig

    return AutoModelForCausalLM.from_config(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=4))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_packed_reward_scores_equal_padded_scores(always_pack, arch):
    """A decoder reward model read at each row's last real token (right-padded rows, as RM training and
    scoring batch them): same scores and same gradients packed or padded."""
    from transformers import AutoModelForSequenceClassification

    from rlhfkit.data.collate import SequenceBatch
    from rlhfkit.models.reward import sequence_scores

    config = make_config(arch, VOCAB, EOS)
    config.num_labels, config.pad_token_id = 1, PAD
    torch.manual_seed(2)
    rm = AutoModelForSequenceClassification.from_config(config).eval()
    rng = random.Random(5)
    lengths = [rng.randint(2, 20) for _ in range(9)]
    ids = torch.full((9, max(lengths)), PAD)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.tensor([rng.randrange(2, VOCAB) for _ in range(n)])
        mask[i, :n] = 1
    batch = SequenceBatch(ids, mask, mask)
    assert pack_batch(rm, ids, mask, PAD).input_ids.shape[0] < 9
    results = padded_then_packed(rm, lambda: sequence_scores(rm, batch))
    assert torch.allclose(results[0][0], results[1][0], atol=2e-5)
    assert_same_gradients(results)


def preference_pairs(seed: int):
    """Five (chosen, rejected) pairs that share their prompt and one pair with two prompts (nothing to share), and
    their ``[2B, L]`` right-padded batch (chosen rows, then rejected rows)."""
    from rlhfkit.data.collate import collate_preferences
    from rlhfkit.data.encode import Encoded

    rng = random.Random(seed)
    words = lambda n: [rng.randrange(2, VOCAB) for _ in range(n)]  # noqa: E731
    pairs = []
    for _ in range(5):
        prompt = words(rng.randint(6, 14))
        pairs.append((Encoded(prompt, words(rng.randint(1, 8))), Encoded(prompt, words(rng.randint(1, 8)))))
    pairs.append((Encoded(words(3), words(2)), Encoded(words(4), words(5))))
    return pairs, collate_preferences(pairs, PAD)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_preference_pairs_share_their_prompt_and_score_as_padded(always_pack, arch):
    """RM training's [2B, L] batch (chosen rows, then rejected rows, right-padded): each pair's two replies
    share one copy of its prompt in the packed rows, and the scores and gradients are the padded batch's."""
    from transformers import AutoModelForSequenceClassification

    from rlhfkit.accel.packing import prompt_first
    from rlhfkit.models.reward import sequence_scores

    config = make_config(arch, VOCAB, EOS)
    config.num_labels, config.pad_token_id = 1, PAD
    torch.manual_seed(3)
    rm = AutoModelForSequenceClassification.from_config(config).eval()
    pairs, batch = preference_pairs(seed=6)

    ids, mask, width, shift = prompt_first(batch.input_ids, batch.attention_mask, batch.response_mask, PAD)
    assert width == max(len(c.prompt_ids) for c, _ in pairs)
    for i, row in enumerate([c for c, _ in pairs] + [r for _, r in pairs]):
        assert ids[i][mask[i].bool()].tolist() == row.prompt_ids + row.response_ids  # the same tokens, in order
        start, stop = width - len(row.prompt_ids), width + len(row.response_ids)  # the prompt ends at width - 1
        assert mask[i, start:stop].all() and int(mask[i].sum()) == stop - start and int(shift[i]) == start
    shared = pack_batch(rm, ids, mask, PAD, prompt_width=width)
    prompt_tokens = sum(len(c.prompt_ids) for c, _ in pairs[:5])
    assert shared.index[mask.bool()].unique().numel() == int(mask.sum()) - prompt_tokens  # each prompt once

    results = padded_then_packed(rm, lambda: sequence_scores(rm, batch))
    assert torch.allclose(results[0][0], results[1][0], atol=2e-5)
    assert_same_gradients(results)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_preference_pairs_share_their_prompt_in_dpo_logprobs(always_pack, monkeypatch, arch):
    """DPO's log pi(y|x) of a [2B, L] preference batch: packed, each pair's two replies share one copy of its
    prompt, and the sums and gradients are the padded batch's. (Where the LM head runs a block of positions at a
    time, as at a real vocabulary; here blocks of 3 positions.)"""
    from rlhfkit.accel import packing, vocab
    from rlhfkit.models.forward import sequence_logprobs

    monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", 3 * VOCAB)

    policy = causal_lm(arch, "sdpa")
    pairs, batch = preference_pairs(seed=8)
    packed = []
    monkeypatch.setattr(passes, "pack_batch", lambda *a, **k: packed.append(packing.pack_batch(*a, **k)) or packed[-1])
    results = padded_then_packed(policy, lambda: sequence_logprobs(policy, batch))
    assert torch.allclose(results[0][0], results[1][0], atol=5e-5)
    assert_same_gradients(results)
    _, mask, _, _ = packing.prompt_first(batch.input_ids, batch.attention_mask, batch.response_mask, PAD)
    shared_prompts = sum(len(c.prompt_ids) for c, _ in pairs[:5])
    (only,) = packed
    assert only.index[mask.bool()].unique().numel() == int(mask.sum()) - shared_prompts  # each prompt laid out once


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_packed_sequence_logprobs_equal_padded(always_pack, arch):
    """DPO's log pi(y|x) of right-padded prompt + response rows: same sums and gradients packed or padded."""
    from rlhfkit.data.collate import SequenceBatch
    from rlhfkit.models.forward import sequence_logprobs

    policy = causal_lm(arch, "sdpa")
    rng = random.Random(7)
    rows = [(rng.randint(1, 8), rng.randint(1, 12)) for _ in range(8)]  # (prompt, response) lengths
    L = max(p + r for p, r in rows)
    ids, mask, response = (
        torch.full((8, L), PAD),
        torch.zeros(8, L, dtype=torch.long),
        torch.zeros(8, L, dtype=torch.long),
    )
    for i, (p, r) in enumerate(rows):
        ids[i, : p + r] = torch.tensor([rng.randrange(2, VOCAB) for _ in range(p + r)])
        mask[i, : p + r] = 1
        response[i, p : p + r] = 1
    batch = SequenceBatch(ids, mask, response)
    assert pack_batch(policy, ids, mask, PAD).input_ids.shape[0] < 8
    results = padded_then_packed(policy, lambda: sequence_logprobs(policy, batch))
    assert torch.allclose(results[0][0], results[1][0], atol=5e-5)
    assert_same_gradients(results)


def test_packed_sft_loss_equals_padded(always_pack, monkeypatch, tmp_path, capsys, tiny_model_dir):
    """SFT's summed token loss (labels on completion tokens only): same value and gradients packed or padded,
    and `rlhfkit sft` hands --pack-sequences to every training pass."""
    from rlhfkit.data.collate import collate_sft
    from rlhfkit.trainers import sft

    policy = causal_lm("llama", "sdpa")
    rng = random.Random(9)
    items = []
    for _ in range(8):
        p, c = rng.randint(1, 8), rng.randint(1, 12)
        ids = [rng.randrange(2, VOCAB) for _ in range(p + c)]
        items.append((ids, [-100] * p + ids[p:]))
    batch = collate_sft(items, PAD)
    assert pack_batch(policy, batch["input_ids"], batch["attention_mask"], PAD).input_ids.shape[0] < 8
    counts = {}

    def loss() -> torch.Tensor:
        total, counts[accel.setting("pack_sequences")] = sft.token_loss_sum(policy, batch)
        return total

    results = padded_then_packed(policy, loss)
    assert counts[False] == counts[True] and float(results[0][0]) == pytest.approx(float(results[1][0]), rel=1e-5)
    assert_same_gradients(results)
    # Wiring: two short runs, the option on (default) and off, reach every training and eval pass.
    from ..helpers import run_cli, sft_args, sft_rows, write_jsonl

    seen = []
    real = sft.token_loss_sum
    monkeypatch.setattr(sft, "token_loss_sum", lambda m, b: seen.append(accel.setting("pack_sequences")) or real(m, b))
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(16))
    for flag in ("true", "false"):
        seen.clear()
        code, _, _ = run_cli(
            capsys,
            *sft_args(
                tiny_model_dir,
                data,
                tmp_path / flag,
                max_steps=2,
                batch_size=4,
                eval_data=data,
                eval_steps=2,
                pack_sequences=flag,
            ),
        )
        assert code == 0 and len(seen) >= 6 and set(seen) == {flag == "true"}


def test_packed_forward_through_lora_adapters(always_pack):
    """The one-backbone LoRA mode: the PEFT-wrapped policy, and its reference (adapters off), packed or padded."""
    from rlhfkit.config.parts import LoraArgs
    from rlhfkit.models.lora import adapters_off, apply_lora

    policy = apply_lora(causal_lm("gpt2", "sdpa"), LoraArgs(lora_r=4))
    for name, w in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(w, std=0.05)  # adapters that change the outputs
    assert can_pack(policy)
    ids, mask, T = ragged_batch(8)
    assert pack_batch(policy, ids, mask, PAD, prompt_width=ids.shape[1] - T) is not None
    m = mask[:, -T:].float()
    packed_lp = {}
    for adapters in (True, False):
        with adapters_off(policy) if not adapters else torch.enable_grad():
            with packing_on(False):
                padded = response_logprobs(policy, ids, mask, T) * m
            with packing_on(True):
                packed_lp[adapters] = response_logprobs(policy, ids, mask, T) * m
        assert torch.allclose(padded, packed_lp[adapters], atol=2e-5), adapters
    assert not torch.allclose(packed_lp[True], packed_lp[False], atol=1e-3)  # the adapters do change the policy


def grouped_batch(seed: int, groups: int = 3, group_size: int = 4, common: int = 0):
    """[left-padded prompt | right-padded response] rows in groups of ``group_size`` that share their prompt
    (as GRPO's completions of one prompt do), responses of different lengths; the row order shuffled. Every
    prompt starts with the same ``common`` tokens (as a chat template's system message does)."""
    rng = random.Random(seed)
    head = [rng.randrange(2, VOCAB) for _ in range(common)]
    prompts = [head + [rng.randrange(2, VOCAB) for _ in range(rng.randint(2, 9))] for _ in range(groups)]
    rows = [(g, [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 10))]) for g in range(groups)]
    rows = [(g, r) for g in range(groups) for r in [rows[g][1]] + [None] * (group_size - 1)]
    rows = [(g, r or [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 10))]) for g, r in rows]
    rng.shuffle(rows)
    P, T = max(len(p) for p in prompts), max(len(r) for _, r in rows)
    ids = torch.full((len(rows), P + T), PAD)
    mask = torch.zeros(len(rows), P + T, dtype=torch.long)
    for i, (g, r) in enumerate(rows):
        ids[i, P - len(prompts[g]) : P + len(r)] = torch.tensor(prompts[g] + r)
        mask[i, P - len(prompts[g]) : P + len(r)] = 1
    return ids, mask, P, T, [g for g, _ in rows]


def test_rows_with_one_prompt_share_it(always_pack):
    """With the prompt width given, the completions of one prompt share one copy of its tokens: fewer packed
    positions, each response token placed once, the prompt's tokens shared by their rows, and the mask
    lets a response see its prompt and its own earlier tokens only."""
    ids, mask, P, T, group = grouped_batch(0)
    model = causal_lm("gpt2", "sdpa")
    plain, shared = pack_batch(model, ids, mask, PAD), pack_batch(model, ids, mask, PAD, prompt_width=P)
    real = mask.bool()
    n_prompt = sum(int(mask[group.index(g), :P].sum()) for g in set(group))
    used = set(shared.index[real].tolist())
    assert len(used) == int(mask[:, P:].sum()) + n_prompt < len(set(plain.index[real].tolist()))
    assert torch.equal(shared.input_ids.flatten()[shared.index[real]], ids[real])
    assert torch.equal(shared.position_ids.flatten()[shared.index[real]], (mask.cumsum(1) - 1)[real])
    response = [set(shared.index[i, P:][real[i, P:]].tolist()) for i in range(len(group))]
    for i in range(len(group)):  # rows of one group: the same prompt positions; response positions their own
        for j in range(len(group)):
            same_prompt = torch.equal(shared.index[i, :P], shared.index[j, :P])
            assert same_prompt == (group[i] == group[j])
            assert i == j or not response[i] & response[j]
    allowed = shared.allowed[:, 0].reshape(-1, shared.input_ids.shape[1])  # [R*C, C]
    C = shared.input_ids.shape[1]
    for i in range(len(group)):
        last = int(shared.index[i, P + int(mask[i, P:].sum()) - 1])  # the row's last response token
        r, c = divmod(last, C)
        seen = {r * C + k for k in range(C) if allowed[r * C + c, k]}
        assert seen == set(shared.index[i][real[i]].tolist())


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_shared_prompt_packing_equals_padded_forward(always_pack, arch):
    """Log-probs, values and entropies, and every weight's gradient: the same from rows that share prompts."""
    policy = causal_lm(arch, "sdpa")
    ids, mask, P, T, _ = grouped_batch(1)
    packed = pack_batch(policy, ids, mask, PAD, prompt_width=P)
    assert packed.input_ids.numel() < pack_batch(policy, ids, mask, PAD).input_ids.numel()
    assert_packed_matches_padded(policy, ids, mask, T)


def test_the_lm_head_runs_on_the_kept_positions_only(always_pack):
    """Packed log-probs take the LM head's matmul on the gathered response positions, not on every packed
    position; a hook on the model's forward makes it run whole (the hook must see its call)."""
    policy = causal_lm("gpt2", "sdpa")
    ids, mask, T = ragged_batch(2)
    packed = pack_batch(policy, ids, mask, PAD, prompt_width=ids.shape[1] - T)  # as the pass packs them
    rows = []
    handle = policy.lm_head.register_forward_hook(lambda m, a, out: rows.append(out.shape[:-1].numel()))
    response_logprobs(policy, ids, mask, T)
    assert rows == [len(ids) * T] and len(ids) * T != packed.input_ids.numel()
    calls = []
    hook = policy.register_forward_hook(lambda *a: calls.append(1))
    rows.clear()
    response_logprobs(policy, ids, mask, T)
    assert calls == [1] and rows == [packed.input_ids.numel()]
    hook.remove(), handle.remove()


def test_common_prefix_counts_the_leading_real_tokens_all_rows_share():
    ids = torch.tensor([[PAD, PAD, 5, 6, 7, 8], [5, 6, 7, 9, 9, 9], [PAD, 5, 6, 7, 8, 2]])
    mask = (ids != PAD).long()
    assert packing.common_prefix(ids, mask, 10) == 3  # left padding does not count; 5, 6, 7 lead every row
    assert packing.common_prefix(ids, mask, 2) == 2
    assert packing.common_prefix(ids[:1], mask[:1], 10) == 0  # one row alone has nothing to share
    assert packing.common_prefix(torch.stack([ids[0], ids[0]]), torch.stack([mask[0]] * 2), 10) == 4


def test_the_prefix_every_row_shares_is_laid_out_once_per_packed_row():
    """Prompts that differ after a common head (a system message): each packed row holds one copy of the head,
    which every sequence of the row attends to; each row's last token sees exactly that row's tokens. (Attention
    is priced as it is, so the batch packs into several rows.)"""
    K = 6
    ids, mask, P, T, group = grouped_batch(2, groups=4, group_size=3, common=K)
    model = causal_lm("llama", "sdpa")
    real = mask.bool()
    for width in (0, P):  # rows alone, and rows of one prompt sharing it
        packed = pack_batch(model, ids, mask, PAD, prompt_width=width)
        R, C = packed.input_ids.shape
        assert 1 < R < len(ids)  # several sequences in each of several packed rows
        used = packed.index[real]
        assert torch.equal(packed.input_ids.flatten()[used], ids[real])
        assert torch.equal(packed.position_ids.flatten()[used], (mask.cumsum(1) - 1)[real])
        head = packed.index[real.cumsum(1).le(K) & real].view(len(ids), K)  # each row's first K tokens
        assert set(head[:, 0].tolist()) == {r * C for r in range(R)}  # one copy per packed row, at its start
        groups = len(set(group)) if width else len(ids)
        prompts = sum(int(mask[group.index(g), :P].sum()) - K for g in set(group)) if width else 0
        responses = int(real.sum()) - K * len(ids) - (int(mask[:, :P].sum()) - K * len(ids) if width else 0)
        assert len(set(used.tolist())) == R * K + prompts + responses
        assert groups > 1
        allowed = packed.allowed[:, 0].reshape(-1, C)
        for i in range(len(ids)):
            last = int(packed.index[i, P + int(mask[i, P:].sum()) - 1])
            r, c = divmod(last, C)
            assert {r * C + k for k in range(C) if allowed[r * C + c, k]} == set(packed.index[i][real[i]].tolist())


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("share_prompts", [False, True])
def test_a_shared_head_packs_to_the_padded_outputs_and_gradients(always_pack, arch, share_prompts):
    """Log-probs, values and entropies, every weight's gradient and the reference log-probs: the same from
    packed rows that hold the common head once as from the padded batch."""
    policy = causal_lm(arch, "sdpa")
    ids, mask, P, T, _ = grouped_batch(3, common=5)
    packed = pack_batch(policy, ids, mask, PAD, prompt_width=P if share_prompts else 0)
    assert packed.index[:, :P][mask[:, :P].bool()].unique().numel() < int(mask[:, :P].sum()) - 5 * (len(ids) - 3)
    assert_packed_matches_padded(policy, ids, mask, T)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_preference_pairs_with_a_common_head_score_and_log_prob_as_padded(always_pack, monkeypatch, arch):
    """Reward scores and DPO log-probs of preference pairs whose prompts all open with the same tokens. (The LM
    head a block of 3 positions at a time, as at a real vocabulary, where the pairs' prompts are shared.)"""
    from transformers import AutoModelForSequenceClassification

    from rlhfkit.accel import vocab
    from rlhfkit.data.collate import collate_preferences
    from rlhfkit.data.encode import Encoded
    from rlhfkit.models.forward import sequence_logprobs
    from rlhfkit.models.reward import sequence_scores

    monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", 3 * VOCAB)
    rng = random.Random(11)
    words = lambda n: [rng.randrange(2, VOCAB) for _ in range(n)]  # noqa: E731
    head = words(7)
    pairs = []
    for _ in range(6):
        prompt = head + words(rng.randint(1, 6))
        pairs.append((Encoded(prompt, words(rng.randint(1, 8))), Encoded(prompt, words(rng.randint(1, 8)))))
    batch = collate_preferences(pairs, PAD)
    config = make_config(arch, VOCAB, EOS)
    config.num_labels, config.pad_token_id = 1, PAD
    torch.manual_seed(4)
    rm = AutoModelForSequenceClassification.from_config(config).eval()
    packs = []
    real_pack = packing.pack_batch
    monkeypatch.setattr(passes, "pack_batch", lambda *a, **k: packs.append(real_pack(*a, **k)) or packs[-1])
    scores = padded_then_packed(rm, lambda: sequence_scores(rm, batch))
    assert torch.allclose(scores[0][0], scores[1][0], atol=2e-5)
    assert_same_gradients(scores)
    policy = causal_lm(arch, "sdpa")
    logprobs = padded_then_packed(policy, lambda: sequence_logprobs(policy, batch))
    assert torch.allclose(logprobs[0][0], logprobs[1][0], atol=5e-5)
    assert_same_gradients(logprobs)
    assert len(packs) == 2
    for p in packs:  # the head once per packed row, each prompt's rest once per pair
        R = p.input_ids.shape[0]
        prompt_rest = sum(len(c.prompt_ids) - 7 for c, _ in pairs)
        replies = sum(len(c.response_ids) + len(r.response_ids) for c, r in pairs)
        assert p.index[p.index > 0].unique().numel() == R * 7 + prompt_rest + replies - 1  # (less position 0)


def test_evaluation_kl_runs_packed_and_equals_the_padded_kl(always_pack, monkeypatch):
    """`rlhfkit eval`'s per-response KL to the reference: both models on packed rows (prompts sharing a head,
    and a prompt sampled twice), the same sums as on the padded rows."""
    from rlhfkit.inference import evaluate

    policy, reference = causal_lm("llama", "sdpa"), causal_lm("llama", "sdpa")
    torch.manual_seed(5)
    for w in reference.parameters():
        w.data += 0.05 * torch.randn_like(w)  # a reference that differs from the policy
    rng = random.Random(12)
    head = [rng.randrange(2, VOCAB) for _ in range(5)]
    prompts = [head + [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    prompts += prompts[:2]
    responses = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 9))] for _ in prompts]
    packs = []
    real_pack = packing.pack_batch
    monkeypatch.setattr(passes, "pack_batch", lambda *a, **k: packs.append(real_pack(*a, **k)) or packs[-1])
    with packing_on(True):
        packed = evaluate.sequence_kl(policy, reference, prompts, responses, PAD, 0.7, "cpu", batch_size=4)
    assert len(packs) == 2 and all(p is not None for p in packs)  # two batches, each packed once for both models
    with packing_on(False):
        padded = evaluate.sequence_kl(policy, reference, prompts, responses, PAD, 0.7, "cpu", batch_size=4)
    assert len(packs) == 2
    assert min(abs(x) for x in padded) > 1e-3  # the two models differ on every response
    assert packed == pytest.approx(padded, abs=1e-4)


@pytest.mark.usefixtures("always_pack")
def test_packed_rows_read_grouped_keys_in_place(monkeypatch):
    """The packed forward attends over its whole rows with the key / value heads read by their query heads'
    groups, not copied out per query head: the padded forward's outputs and gradients, and for backward exactly
    those copies' bytes fewer kept than transformers' own sdpa path."""
    calls = []
    whole = packing.whole_rows
    monkeypatch.setattr(packing, "whole_rows", lambda *a: calls.append(1) or whole(*a))
    policy = causal_lm("llama", "sdpa")
    cfg = policy.config
    ids, mask, P, T, _ = grouped_batch(7, groups=2, group_size=5, common=3)
    packed = pack_batch(policy, ids, mask, PAD, prompt_width=P)
    assert_packed_matches_padded(policy, ids, mask, T)
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
