"""A plain LoRA adapter merges without PEFT's wrapping to exactly the weights PEFT's merge gives (GPT-2's Conv1D
and Llama's Linear modules, a reward model's score head saved whole); anything else is left to PEFT."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhfkit.config.commands import InitModelConfig
from rlhfkit.models import loading, plain_lora
from rlhfkit.models.init_model import init_model


@pytest.fixture(scope="module")
def bases(tiny_model_dir, tiny_corpus, tmp_path_factory):
    llama = tmp_path_factory.mktemp("llama")
    init_model(InitModelConfig(output_dir=str(llama), corpus=str(tiny_corpus), arch="llama", size="tiny", seed=0))
    return {"gpt2": tiny_model_dir, "llama": llama}


def save_adapter(base, out, task_type="CAUSAL_LM", **extra):
    """A LoRA adapter on ``base`` with random (non-zero) A and B, saved as a training run saves one."""
    auto = AutoModelForCausalLM if task_type == "CAUSAL_LM" else AutoModelForSequenceClassification
    model = auto.from_pretrained(base, **({} if task_type == "CAUSAL_LM" else {"num_labels": 1}))
    config = LoraConfig(
        r=4, lora_alpha=16, target_modules="all-linear", task_type=task_type, init_lora_weights=False, **extra
    )
    torch.manual_seed(1)
    wrapped = get_peft_model(model, config)
    if task_type == "SEQ_CLS":
        with torch.no_grad():
            for name, p in wrapped.named_parameters():
                if "score" in name:
                    p.normal_()  # the score head trained in full: saved whole
    wrapped.save_pretrained(out)
    return out


def merged_both_ways(auto, base, adapter, monkeypatch, **kwargs):
    """The model loaded from ``base`` with ``adapter`` merged: (rlhfkit's merge, PEFT's merge)."""
    torch.manual_seed(2)
    fast = loading.merge_adapter(auto.from_pretrained(base, **kwargs), str(adapter))
    with monkeypatch.context() as m:
        m.setattr(loading, "merge_plain_lora", lambda *a: False)
        torch.manual_seed(2)
        peft = loading.merge_adapter(auto.from_pretrained(base, **kwargs), str(adapter))
    return fast, peft


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    assert type(a) is type(b) and not a.training and not b.training


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_plain_adapter_merges_to_pefts_weights_bit_for_bit(bases, arch, tmp_path, monkeypatch):
    base = bases[arch]
    taken = []
    merge = plain_lora.merge_plain_lora
    monkeypatch.setattr(loading, "merge_plain_lora", lambda *a: taken.append(merge(*a)) or taken[-1])
    adapter = save_adapter(base, tmp_path / "lm")
    fast, peft = merged_both_ways(AutoModelForCausalLM, base, adapter, monkeypatch)
    assert taken == [True]  # the direct merge ran
    assert_same_weights(fast, peft)
    untouched = AutoModelForCausalLM.from_pretrained(base)
    assert any(not torch.equal(p, q) for p, q in zip(fast.parameters(), untouched.parameters()))  # it did merge

    # a reward model's adapter: LoRA on the backbone, the score head saved whole
    rm = save_adapter(base, tmp_path / "rm", task_type="SEQ_CLS")
    fast, peft = merged_both_ways(AutoModelForSequenceClassification, base, rm, monkeypatch, num_labels=1)
    assert taken == [True, True]
    assert_same_weights(fast, peft)


def test_anything_but_plain_lora_on_float32_is_left_to_peft(bases, tmp_path, monkeypatch):
    base = bases["llama"]
    dora = save_adapter(base, tmp_path / "dora", use_dora=True)
    model = AutoModelForCausalLM.from_pretrained(base)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not plain_lora.merge_plain_lora(model, str(dora), loading.adapter_settings(str(dora)))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    fast, peft = merged_both_ways(AutoModelForCausalLM, base, dora, monkeypatch)  # PEFT merges it
    assert_same_weights(fast, peft)

    plain = save_adapter(base, tmp_path / "plain")
    half = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    assert not plain_lora.merge_plain_lora(half, str(plain), loading.adapter_settings(str(plain)))
    settings = {**loading.adapter_settings(str(plain)), "r": 8}  # ranks that do not match the saved weights
    assert not plain_lora.merge_plain_lora(AutoModelForCausalLM.from_pretrained(base), str(plain), settings)
