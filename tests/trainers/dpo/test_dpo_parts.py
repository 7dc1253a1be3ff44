"""The pieces of the DPO trainer against naive oracles: one forward pass per pair batch, the loss on
a batch, the reference (frozen copy, LoRA adapters off, precomputed table)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.config.commands import DPOArgs
from rlhfkit.config.parts import DataArgs, LoraArgs
from rlhfkit.data.schema import load_examples
from rlhfkit.models.forward import sequence_logprobs
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.lora import apply_lora
from rlhfkit.ops import dpo_loss
from rlhfkit.trainers import dpo

from .dpo_task import TRAIN_ITEMS, prompt, write_rows


@pytest.fixture(scope="module")
def parts(task, tmp_path_factory):
    """Tokenizer, the base model, and pairs whose chosen and rejected replies differ in length."""
    rows = [
        {"prompt": prompt(item), "chosen": f" yes, I like {item} a lot.", "rejected": " no."}
        for item in TRAIN_ITEMS[:6]
    ]
    path = write_rows(tmp_path_factory.mktemp("parts") / "pairs.jsonl", rows)
    tokenizer = load_tokenizer(task.base)
    pairs = dpo.encode_all(tokenizer, load_examples(path, "preference", "test"), DataArgs())
    return tokenizer, load_causal_lm(task.base, tokenizer=tokenizer).eval(), pairs


def perturbed(model, seed: int = 0):
    policy = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return policy


def naive_logp(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """log pi(response | prompt), one unpadded sequence, token by token."""
    ids = torch.tensor([prompt_ids + response_ids])
    logprobs = F.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    start = len(prompt_ids)
    return sum(logprobs[t - 1, ids[0, t]] for t in range(start, ids.shape[1]))


@pytest.mark.parametrize("loss_type, label_smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_batch_loss_matches_dpo_loss_on_separate_unpadded_passes(parts, loss_type, label_smoothing):
    tokenizer, base, pairs = parts
    policy = perturbed(base)
    args = DPOArgs(beta=0.3, loss_type=loss_type, label_smoothing=label_smoothing)
    batch = dpo.make_batch(pairs, [3, 0, 5, 1], tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        losses, sums = dpo.pair_losses(
            sequence_logprobs(policy, batch.seqs), dpo.Reference(base).logps(batch, "train"), args
        )

    with torch.no_grad():
        pc, pr, rc, rr = (
            torch.stack([naive_logp(m, pairs[i][k].prompt_ids, pairs[i][k].response_ids) for i in [3, 0, 5, 1]])
            for m, k in ((policy, 0), (policy, 1), (base, 0), (base, 1))
        )
    expected, chosen_rewards, rejected_rewards = dpo_loss(pc, pr, rc, rr, 0.3, loss_type, label_smoothing)
    # float32 model passes against a float64 oracle: the IPO loss is ~50 here, hence the relative part.
    torch.testing.assert_close(losses.double(), expected, rtol=1e-5, atol=1e-5)
    assert sums["loss"] == pytest.approx(float(expected.sum()), rel=1e-5, abs=1e-5)
    assert sums["rewards/margin"] == pytest.approx(float((chosen_rewards - rejected_rewards).sum()), abs=1e-5)
    assert sums["rewards/accuracy"] == float((chosen_rewards > rejected_rewards).sum())
    assert sums["logps/chosen"] == pytest.approx(float(pc.sum()), abs=1e-4)
    assert expected.std() > 0.01  # pairs with different losses, so a mixed-up order would show


def test_reference_table_looks_rows_up_by_index(parts):
    tokenizer, base, pairs = parts
    reference = dpo.Reference(base)
    reference.precompute(
        "train", pairs, tokenizer.pad_token_id, batch_size=4, device="cpu", autocast=contextlib.nullcontext
    )
    batch = dpo.make_batch(pairs, [5, 2, 0], tokenizer.pad_token_id, "cpu")
    live = reference.forward(batch.seqs)
    looked_up = reference.logps(batch, "train")
    torch.testing.assert_close(looked_up, live, rtol=0, atol=1e-5)
    assert reference.logps(batch, "eval").equal(live)  # no table for this split: computed live
    assert not torch.allclose(looked_up, looked_up.roll(1), atol=1e-3)  # rows differ, so the order is tested


def test_reference_cache_fills_rows_as_they_are_first_asked_for(parts, monkeypatch):
    tokenizer, base, pairs = parts
    reference = dpo.Reference(base)
    reference.cache("train", len(pairs))
    passes = []
    forward = reference.forward
    monkeypatch.setattr(reference, "forward", lambda seqs: passes.append(seqs.input_ids.shape[0]) or forward(seqs))
    first, overlapping = ([5, 2, 0], [0, 3, 5])
    for rows in (first, first, overlapping, overlapping):
        batch = dpo.make_batch(pairs, rows, tokenizer.pad_token_id, "cpu")
        torch.testing.assert_close(reference.logps(batch, "train"), forward(batch.seqs), rtol=0, atol=1e-5)
    assert passes == [6, 6]  # a pass for the new batch, one for the batch with an unseen row; then look-ups
    assert torch.isnan(reference.tables["train"][:, 0]).tolist() == [i not in (0, 2, 3, 5) for i in range(6)]


def test_lora_reference_is_the_adapter_free_base(parts, task):
    tokenizer, base, pairs = parts
    policy = apply_lora(load_causal_lm(task.base, tokenizer=tokenizer), LoraArgs(lora_r=4))
    with torch.no_grad():  # train the adapters a little (B starts at 0, which would make the test vacuous)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    batch = dpo.make_batch(pairs, [0, 1, 2], tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        from_reference = dpo.Reference(policy).logps(batch, "train")
        from_base = sequence_logprobs(base, batch.seqs)
        from_policy = sequence_logprobs(policy, batch.seqs)
    torch.testing.assert_close(from_reference, from_base, rtol=0, atol=1e-5)
    assert (from_policy - from_base).abs().max() > 0.1
    torch.testing.assert_close(sequence_logprobs(policy, batch.seqs), from_policy)  # adapters back on afterwards


@pytest.mark.parametrize("precompute, reference_passes", [(False, 4), (True, 0)])
def test_one_policy_pass_per_micro_batch_over_chosen_and_rejected(
    dpo_config, monkeypatch, precompute, reference_passes
):
    calls = []
    real = dpo.sequence_logprobs

    def recording(model, seqs):
        calls.append((torch.is_grad_enabled(), seqs.input_ids.shape[0]))
        return real(model, seqs)

    monkeypatch.setattr(dpo, "sequence_logprobs", recording)
    cfg = dpo_config(
        "run",
        "--max-steps",
        "2",
        "--batch-size",
        "6",
        "--gradient-accumulation-steps",
        "2",
        "--precompute-ref",
        str(precompute).lower(),
    )
    dpo.train(cfg)
    # --precompute-ref: the reference runs once over the 20 training pairs, 3 pairs per batch, first.
    precomputed = [(False, 6)] * 6 + [(False, 4)] if precompute else []
    assert calls[: len(precomputed)] == precomputed
    loop = calls[len(precomputed) :]
    assert sum(1 for grad, _ in loop if grad) == 4  # 2 steps x 2 micro-batches
    assert all(rows == 6 for _, rows in loop)  # [2B, L]: 3 chosen + 3 rejected in one pass
    assert sum(1 for grad, _ in loop if not grad) == reference_passes


def test_lora_precomputes_each_pair_when_first_drawn(dpo_config, monkeypatch):
    """With LoRA the reference is the policy's backbone: --precompute-ref computes no pair before training, each
    pair's reference log-probs in the step that first draws it, and none in the second epoch."""
    calls = []
    real = dpo.sequence_logprobs

    def recording(model, seqs):
        calls.append(torch.is_grad_enabled())
        return real(model, seqs)

    monkeypatch.setattr(dpo, "sequence_logprobs", recording)
    cfg = dpo_config("run", "--lora-r", "4", "--batch-size", "4", "--max-steps", "10", "--precompute-ref", "true")
    dpo.train(cfg)
    # 20 training pairs: 5 steps per epoch, in the first each a reference pass (no grad) after the policy's
    assert calls == [True, False] * 5 + [True] * 5
