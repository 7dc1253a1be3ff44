"""``evaluate_policy`` measures a policy against a reward model and a reference given as folders or as models
already loaded (the demo loads them once for all its policies): the same rows either way."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhfkit.config.parts import GenerationArgs
from rlhfkit.inference.evaluate import evaluate_policy
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.reward import RewardScorer


def test_loaded_reward_model_and_reference_give_the_rows_their_folders_give(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a policy apart from its reference
    policy.save_pretrained(tmp_path / "policy")
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    rm.config.pad_token_id = tokenizer.pad_token_id
    rm.save_pretrained(tmp_path / "rm")
    for folder in ("policy", "rm"):
        tokenizer.save_pretrained(tmp_path / folder)
    prompts = ["Question: what does alice want? Answer:", "please give bob the hat"] * 3
    gen = GenerationArgs(max_new_tokens=6)
    policy_dir, kwargs = str(tmp_path / "policy"), dict(seed=3, batch_size=4)

    _, by_folder = evaluate_policy(
        policy_dir, prompts, gen, reward_model=str(tmp_path / "rm"), reference=str(tiny_model_dir), **kwargs
    )
    scorer = RewardScorer.load(str(tmp_path / "rm"), "cpu")
    reference = load_causal_lm(str(tiny_model_dir), tokenizer=tokenizer).eval()
    _, loaded = evaluate_policy(policy_dir, prompts, gen, reward_model=scorer, reference=reference, **kwargs)
    assert loaded == by_folder
    assert all({"score", "kl"} <= set(row) for row in loaded) and any(row["kl"] != 0 for row in loaded)

    for none in ("", None):  # no reference: no KL
        _, rows = evaluate_policy(policy_dir, prompts, gen, reward_model=scorer, reference=none, **kwargs)
        assert [r["response"] for r in rows] == [r["response"] for r in loaded] and "kl" not in rows[0]


def test_kl_from_the_samplers_log_probs_is_the_kl_of_a_forward_pass(tiny_model_dir, tmp_path, monkeypatch):
    from rlhfkit.inference import evaluate

    tokenizer = load_tokenizer(str(tiny_model_dir))
    torch.manual_seed(1)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    prompts = ["Question: what does alice want? Answer:", "please give bob the hat", "hi"] * 2
    kwargs = dict(reference=str(tiny_model_dir), seed=2, batch_size=4)
    gen = GenerationArgs(max_new_tokens=8, temperature=0.7)
    metrics, sampled = evaluate_policy(str(tmp_path / "policy"), prompts, gen, **kwargs)
    seen = []
    forward = evaluate.sequence_kl
    monkeypatch.setattr(
        evaluate, "sequence_kl", lambda *a: seen.append(a[-1]) or forward(*a[:-1])
    )  # the policy's log-probs from a forward pass
    again, by_forward = evaluate_policy(str(tmp_path / "policy"), prompts, gen, **kwargs)
    assert seen and seen[0] is not None and len(seen[0]) == len(prompts)
    assert [r["response"] for r in sampled] == [r["response"] for r in by_forward]
    assert [r["kl"] for r in sampled] == pytest.approx([r["kl"] for r in by_forward], abs=1e-4)
    assert any(abs(r["kl"]) > 0.01 for r in sampled)
    assert metrics["kl/ref"] == pytest.approx(again["kl/ref"], abs=1e-4)
