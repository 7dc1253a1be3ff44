"""`sample_responses`: left padding is invisible, responses stop after the first EOS, seeding, neutral defaults,
the sampled distribution, LoRA / DDP wrappers, and the `model.generate` fallback."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rlhfkit.config.parts import GenerationArgs, LoraArgs
from rlhfkit.models import sampling
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import adapters_off, apply_lora
from rlhfkit.models.sampling import cut_at_stop, decode, sample_responses

PROMPTS = ["Question: what does alice want? Answer:", "hi", "User: please give bob the hat\nAssistant:", "the egg"]


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_causal_lm(str(tiny_model_dir), tokenizer=tok)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    assert len({len(i) for i in ids}) == len(ids)  # different lengths, so the batch is padded
    return model, tok, ids


def greedy_unpadded(model, prompt_ids: list[int], n: int, eos: int) -> list[int]:
    """Oracle: argmax decoding one prompt at a time, full forward pass each step, no cache, no padding."""
    seq = list(prompt_ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            token = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            out.append(token)
            seq.append(token)
            if token == eos:
                break
    return out


def test_left_padded_batched_sampling_matches_one_prompt_at_a_time(lm):
    model, tok, ids = lm
    args = GenerationArgs(max_new_tokens=12, top_k=1)  # top-k 1 makes sampling deterministic (greedy)
    got = sample_responses(model, tok, ids, args, batch_size=4, device="cpu")
    want = [greedy_unpadded(model, p, 12, tok.eos_token_id) for p in ids]
    assert got == want


def test_responses_stop_after_the_first_eos(lm):
    model, tok, ids = lm
    eos = tok.eos_token_id
    assert tok.pad_token_id != eos
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(
        lambda _m, _i, out: out + 4.0 * torch.nn.functional.one_hot(torch.tensor(eos), out.shape[-1]).to(out.dtype)
    )  # make EOS likely, at random places
    try:
        torch.manual_seed(0)
        got = sample_responses(model, tok, ids * 4, GenerationArgs(max_new_tokens=16), batch_size=8, device="cpu")
    finally:
        hook.remove()
    ended = [r for r in got if eos in r]
    assert len(ended) >= 12 and len({len(r) for r in got}) > 3
    for r in got:
        assert 1 <= len(r) <= 16
        assert eos not in r[:-1]  # nothing after the first EOS (no padding), EOS kept as the last token
        assert r[-1] == eos or len(r) == 16  # a response without EOS ran to max_new_tokens
    assert all(decode(tok, r) == tok.decode(r[:-1] if r[-1] == eos else r) for r in got)


def test_sampling_is_seeded_and_ignores_the_models_generation_defaults(lm):
    model, tok, ids = lm
    args = GenerationArgs(max_new_tokens=10, temperature=1.0)

    def sample(seed):
        torch.manual_seed(seed)
        return sample_responses(model, tok, ids, args, batch_size=2, device="cpu")

    first = sample(3)
    assert sample(3) == first and sample(4) != first
    saved = model.generation_config
    model.generation_config = type(saved)(
        **{**saved.to_dict(), "top_k": 1, "repetition_penalty": 3.0, "do_sample": False}
    )
    try:
        assert sample(3) == first  # sampling follows GenerationArgs only
    finally:
        model.generation_config = saved
    assert model.generation_config is saved


def test_top_k_and_temperature_limit_the_choices(lm):
    model, tok, ids = lm
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[0]])).logits[0, -1]
    top2 = set(logits.topk(2).indices.tolist())
    firsts = set()
    for seed in range(12):
        torch.manual_seed(seed)
        (r,) = sample_responses(
            model, tok, [ids[0]], GenerationArgs(max_new_tokens=1, top_k=2, temperature=5.0), 1, "cpu"
        )
        firsts.add(r[0])
    assert firsts == top2


def test_cut_at_stop():
    assert cut_at_stop([5, 6, 0, 7, 0], [0]) == [5, 6, 0]
    assert cut_at_stop([5, 6, 7], [0]) == [5, 6, 7]
    assert cut_at_stop([9, 5, 0], [0, 9]) == [9]


def test_first_token_frequencies_match_the_filtered_distribution(lm):
    model, tok, ids = lm
    with torch.no_grad():  # oracle: Hugging Face's warpers on a full forward of the unpadded prompt
        logits = model(input_ids=torch.tensor([ids[1]])).logits[:, -1]
    probs = TopPLogitsWarper(0.9)(None, TopKLogitsWarper(20)(None, TemperatureLogitsWarper(0.7)(None, logits)))
    probs = probs.softmax(-1)[0].double()  # [V]
    assert 3 <= int((probs > 0).sum()) < 20  # top-p cuts inside the top 20, so both filters act
    n = 20_000
    torch.manual_seed(0)
    got = sample_responses(
        model, tok, [ids[1]] * n, GenerationArgs(max_new_tokens=1, temperature=0.7, top_k=20, top_p=0.9), n, "cpu"
    )
    freq = torch.bincount(torch.tensor([r[0] for r in got]), minlength=len(probs)).double() / n
    assert freq[probs == 0].sum() == 0
    se = (probs * (1 - probs) / n).sqrt()  # binomial standard error of each frequency (<= 0.0036)
    assert ((freq - probs).abs() <= 5 * se).all()


class FakeDDP(torch.nn.Module):
    """What `sample_responses` sees of DistributedDataParallel: the model under ``.module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_lora_and_ddp_wrapped_models_sample_with_their_adapters(lm, tiny_model_dir):
    _, tok, ids = lm
    policy = apply_lora(load_causal_lm(str(tiny_model_dir), tokenizer=tok), LoraArgs(lora_r=4))
    with torch.no_grad():  # B starts at 0, which would make the adapters (and the test) a no-op
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    policy.eval()
    want = [greedy_unpadded(policy, p, 12, tok.eos_token_id) for p in ids]
    with adapters_off(policy):
        assert [greedy_unpadded(policy, p, 12, tok.eos_token_id) for p in ids] != want  # adapters matter
    args = GenerationArgs(max_new_tokens=12, top_k=1)
    assert sample_responses(policy, tok, ids, args, batch_size=4, device="cpu") == want
    assert sample_responses(FakeDDP(policy), tok, ids, args, batch_size=4, device="cpu") == want


def test_loop_forwards_only_until_every_row_has_stopped(lm):
    model, tok, ids = lm
    eos = tok.eos_token_id
    calls = []  # (training flag, logits positions, input length) per forward
    count = model.register_forward_hook(
        lambda m, args, kwargs, out: calls.append((m.training, out.logits.shape[1], kwargs["input_ids"].shape[1])),
        with_kwargs=True,
    )
    likely_eos = model.get_output_embeddings().register_forward_hook(
        lambda _m, _i, out: out + 6.0 * torch.nn.functional.one_hot(torch.tensor(eos), out.shape[-1]).to(out.dtype)
    )
    was_training = model.training
    model.train()  # sample_responses switches to eval and back
    lengths = set()
    try:
        for seed in range(4):
            torch.manual_seed(seed)
            calls.clear()
            done = []
            got = sample_responses(model, tok, ids, GenerationArgs(max_new_tokens=30), 4, "cpu", progress=done.append)
            assert max(len(r) for r in got) < 30 and all(r[-1] == eos for r in got)
            assert len(calls) == max(len(r) for r in got)  # no forward after the last row stopped
            assert [c[2] for c in calls[1:]] == [1] * (len(calls) - 1)  # one new token per step (KV cache)
            assert all(not training and positions == 1 for training, positions, _ in calls)  # eval, logits_to_keep
            assert model.training and done == [4]
            lengths.add(tuple(len(r) for r in got))
        assert any(len(set(batch)) > 1 for batch in lengths)  # rows stopped at different steps, pads fed after
    finally:
        count.remove()
        likely_eos.remove()
        model.train(was_training)


def test_generate_fallback_matches_the_oracle_and_ignores_generation_defaults(lm, monkeypatch):
    model, tok, ids = lm
    want = [greedy_unpadded(model, p, 12, tok.eos_token_id) for p in ids]
    assert any(len(set(p + w)) < len(p + w) for p, w in zip(ids, want))  # a repeat, so the n-gram ban below bites
    saved = model.generation_config
    model.generation_config = type(saved)(**{**saved.to_dict(), "no_repeat_ngram_size": 1, "repetition_penalty": 3.0})
    args = GenerationArgs(max_new_tokens=12, top_k=1)
    try:
        assert sample_responses(model, tok, ids, args, batch_size=4, device="cpu") == want
        monkeypatch.setattr(sampling, "_loop_supported", lambda _model: False)
        assert sample_responses(model, tok, ids, args, batch_size=4, device="cpu") == want
    finally:
        model.generation_config = saved
    assert model.generation_config is saved


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 5)])
def test_sampled_log_probs_are_a_forward_pass_over_the_responses(lm, temperature, top_k):
    from rlhfkit.data.collate import pad_with_mask
    from rlhfkit.models.forward import response_logprobs

    model, tok, ids = lm
    eos = torch.nn.functional.one_hot(torch.tensor(tok.eos_token_id), model.config.vocab_size)
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, _i, out: out + 3.0 * eos.to(out.dtype))
    args = GenerationArgs(max_new_tokens=10, temperature=temperature, top_k=top_k)
    try:  # EOS made likely: replies of different lengths, each cut after its stop
        torch.manual_seed(5)
        plain = sample_responses(model, tok, ids * 2, args, batch_size=8, device="cpu")
        torch.manual_seed(5)
        logprobs: list = []
        got = sample_responses(model, tok, ids * 2, args, batch_size=8, device="cpu", logprobs=logprobs)
        # the same numbers from a forward pass over [prompt | response] at the temperature, before top-k
        q, qm = pad_with_mask(ids * 2, tok.pad_token_id, "left", "cpu")
        r, rm = pad_with_mask(got, tok.pad_token_id, "right", "cpu")
        want = response_logprobs(model, torch.cat([q, r], 1), torch.cat([qm, rm], 1), r.shape[1], temperature)
    finally:
        hook.remove()
    assert got == plain  # asking for them changes no sample
    assert [len(lp) for lp in logprobs] == [len(r) for r in got] and len(set(map(len, got))) > 1
    for row, lp in enumerate(logprobs):
        assert lp == pytest.approx(want[row, : len(lp)].tolist(), abs=1e-5)
    assert all(v < 0 for lp in logprobs for v in lp)


def test_no_sampled_log_probs_from_the_generate_fallback(lm, monkeypatch):
    model, tok, ids = lm
    monkeypatch.setattr(sampling, "_loop_supported", lambda _model: False)
    logprobs: list = []
    got = sample_responses(model, tok, ids, GenerationArgs(max_new_tokens=4), 4, "cpu", logprobs=logprobs)
    assert len(got) == len(ids) and logprobs == []  # the caller runs a forward pass instead
