"""PPO on a tiny model against a known reward: the score rises, KL to the reference stays bounded."""

from __future__ import annotations

import torch

from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.trainers.online import train

from .conftest import ThanksScorer, parse, read_metrics

BASE = "--reward-model none --batch-size 16 --max-new-tokens 8 --progress false --normalize-reward false"


def first_last(rows, key, k=3):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals[:k]) / k, sum(vals[-k:]) / k


def test_score_rises_and_kl_stays_bounded(thanks_task, tmp_path):
    model, prompts = thanks_task
    cfg = parse(
        "ppo",
        f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 20 "
        f"--learning-rate 1e-3 --kl-coef 0.1 {BASE}",
    )
    train(cfg, scorer=ThanksScorer())
    rows = read_metrics(tmp_path)
    start, end = first_last(rows, "reward/score")
    assert end > start + 0.8, (start, end)  # from about -0.4 towards +1
    assert max(r["kl/ref"] for r in rows) < 10.0
    for key in (
        "reward/total",
        "kl/coef",
        "policy/entropy",
        "policy/clipfrac",
        "policy/approx_kl",
        "loss/policy",
        "loss/value",
        "value/explained_variance",
        "response/length",
        "time/step_s",
    ):
        assert key in rows[-1], key
    assert (tmp_path / "samples.jsonl").read_text().count("\n") >= 4
    # the saved policy loads with plain transformers
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.vocab_size > 0


def test_adaptive_beta_moves_toward_target(thanks_task, tmp_path):
    model, prompts = thanks_task
    cfg = parse(
        "ppo",
        f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 6 --learning-rate 1e-3 "
        f"--kl-coef 0.1 --target-kl 0.01 --kl-horizon 100 {BASE}",
    )
    train(cfg, scorer=ThanksScorer())
    betas = [r["kl/coef"] for r in read_metrics(tmp_path)]
    assert betas[0] == 0.1
    # KL above the (tiny) target: beta grows by the maximum factor (1 + 0.2 * 16/100) each step after KL > 0
    assert betas[-1] > betas[0] * 1.05


def test_sequence_advantage_also_learns(thanks_task, tmp_path):
    model, prompts = thanks_task
    cfg = parse(
        "ppo",
        f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 15 "
        f"--learning-rate 1e-3 --advantage sequence --num-minibatches 2 --gradient-accumulation-steps 2 {BASE}",
    )
    train(cfg, scorer=ThanksScorer())
    start, end = first_last(read_metrics(tmp_path), "reward/score")
    assert end > start + 0.5, (start, end)


def test_lora_trains_and_reference_is_base_model(thanks_task, tmp_path):
    from rlhfkit.models.loading import load_tokenizer
    from rlhfkit.models.lora import adapters_off
    from rlhfkit.trainers.online.run import build_models

    model, prompts = thanks_task
    cfg = parse(
        "ppo",
        f"--model {model} --data {prompts} --output-dir {tmp_path} --max-steps 16 "
        f"--learning-rate 5e-3 --lora-r 8 --lora-alpha 16 {BASE}",
    )
    train(cfg, scorer=ThanksScorer())
    start, end = first_last(read_metrics(tmp_path), "reward/score")
    # At 1e-2 for 12 steps one float-rounding change of the matmuls (oneDNN) sent seed 0 into a collapse;
    # 5e-3 for 16 steps rose by 0.54-0.92 on seeds 0-5.
    assert end > start + 0.4, (start, end)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()

    # One backbone: with adapters off the LoRA policy is exactly the starting model.
    tok = load_tokenizer(str(model))
    ac, ref = build_models(cfg, tok)
    assert ref is None
    lora_params = [p for n, p in ac.policy.named_parameters() if "lora_B" in n]
    with torch.no_grad():
        for p in lora_params:
            p.add_(0.5)  # make the adapters matter
    base = load_causal_lm(str(model), tokenizer=tok)
    ids = tok(["Customer: my app is late\nAgent: thanks a lot"], return_tensors="pt")["input_ids"]
    mask = torch.ones_like(ids)
    with adapters_off(ac.policy):
        lp_ref = response_logprobs(ac.policy, ids, mask, 4)
    lp_base = response_logprobs(base, ids, mask, 4)
    lp_policy = response_logprobs(ac.policy, ids, mask, 4)
    torch.testing.assert_close(lp_ref, lp_base, atol=1e-6, rtol=0)
    assert (lp_policy - lp_base).abs().max() > 1e-3
